"""A replica's slot and generation; a node's drain timeout and when it was declared lost.

A slot (`qwen-0`) is the place in its model's count that placement fills; a generation tells
two engines of one slot apart, so a replacement can start on another node while the replica it
replaces still serves (a drain), and so an engine left on a node while the node was out of
reach is recognised as stale. Existing rows become generation 0 of a slot named like them.
"""

REPLICA = [("slot", "TEXT NOT NULL DEFAULT ''"), ("generation", "INTEGER NOT NULL DEFAULT 0")]
NODE = [("drain_timeout", "INTEGER NOT NULL DEFAULT 0"), ("lost_since", "{ts}")]


def up(db, sql):
    for table, columns in (("replica", REPLICA), ("node", NODE)):
        for name, kind in columns:
            db.execute_sql(sql(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))
    db.execute_sql("UPDATE replica SET slot = name")


def down(db, sql):
    for table, columns in (("replica", REPLICA), ("node", NODE)):
        for name, _ in reversed(columns):
            db.execute_sql(f"ALTER TABLE {table} DROP COLUMN {name}")
