"""An engine's own count of running and queued requests, polled off the request path."""


def up(db, sql):
    db.execute_sql("ALTER TABLE replica ADD COLUMN load REAL")


def down(db, sql):
    db.execute_sql("ALTER TABLE replica DROP COLUMN load")
