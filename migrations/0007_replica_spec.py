"""What a replica was started with, so a changed model (or engine upgrade) restarts it."""


def up(db, sql):
    db.execute_sql("ALTER TABLE replica ADD COLUMN spec TEXT NOT NULL DEFAULT ''")


def down(db, sql):
    db.execute_sql("ALTER TABLE replica DROP COLUMN spec")
