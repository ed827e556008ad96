"""Every usage row carries its request's id (also sent to the client as X-Request-Id).

Unique, so a batch whose commit was in fact applied, though its acknowledgement was lost, is
recognised when it is tried again instead of being settled twice. Rows from before have none.
"""


def up(db, sql):
    db.execute_sql("ALTER TABLE usage ADD COLUMN request_id TEXT")
    db.execute_sql("CREATE UNIQUE INDEX usage_request_id ON usage (request_id)")


def down(db, sql):
    db.execute_sql("DROP INDEX usage_request_id")
    db.execute_sql("ALTER TABLE usage DROP COLUMN request_id")
