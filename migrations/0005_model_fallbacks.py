"""Models to serve a request when a model has no ready replica, tried in order."""


def up(db, sql):
    db.execute_sql("ALTER TABLE model ADD COLUMN fallbacks TEXT")


def down(db, sql):
    db.execute_sql("ALTER TABLE model DROP COLUMN fallbacks")
