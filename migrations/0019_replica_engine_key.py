"""Each replica's engine has an API key of its own, sealed with the control plane's key file.

Replicas started before this migration have none: their engines answer without a key until
they are started again (a restart, a move, `model set`), which gives them one.
"""


def up(db, sql):
    db.execute_sql("ALTER TABLE replica ADD COLUMN engine_key TEXT NOT NULL DEFAULT ''")


def down(db, sql):
    db.execute_sql("ALTER TABLE replica DROP COLUMN engine_key")
