"""What a model needs (cards, class, memory, labels, spread) and which cards each replica holds.

A replica's claim (GPU UUIDs, shared card memory, host RAM) is stored on its row so that two
replicas never get the same card, and so that a restarted reconciler sees what is taken.
The model keeps its last placement verdict, which the CLI, the pages and the gateway's 503 quote.
"""

MODEL = [
    ("gpus", "INTEGER NOT NULL DEFAULT 0"),
    ("gpu_classes", "TEXT NOT NULL DEFAULT '[]'"),
    ("min_gpu_memory_mb", "INTEGER NOT NULL DEFAULT 0"),
    ("memory_mb", "INTEGER NOT NULL DEFAULT 0"),
    ("context", "INTEGER NOT NULL DEFAULT 0"),
    ("requires", "TEXT NOT NULL DEFAULT '{{}}'"),
    ("max_per_node", "INTEGER NOT NULL DEFAULT 0"),
    ("share_gpu", "BOOLEAN NOT NULL DEFAULT FALSE"),
    ("on_nodes", "BOOLEAN NOT NULL DEFAULT FALSE"),
    ("origin", "TEXT NOT NULL DEFAULT ''"),
    ("estimate", "TEXT"),
    ("verdict", "TEXT"),
]
REPLICA = [
    ("gpu_uuids", "TEXT NOT NULL DEFAULT '[]'"),
    ("gpu_indexes", "TEXT NOT NULL DEFAULT '[]'"),
    ("gpu_memory_mb", "INTEGER NOT NULL DEFAULT 0"),
    ("memory_mb", "INTEGER NOT NULL DEFAULT 0"),
]


def up(db, sql):
    for table, columns in (("model", MODEL), ("replica", REPLICA)):
        for name, kind in columns:
            db.execute_sql(sql(f"ALTER TABLE {table} ADD COLUMN {name} {kind}"))


def down(db, sql):
    for table, columns in (("model", MODEL), ("replica", REPLICA)):
        for name, _ in reversed(columns):
            db.execute_sql(f"ALTER TABLE {table} DROP COLUMN {name}")
