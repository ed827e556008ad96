"""Gateway workers with a heartbeat, and the slices of limits they lease.

A worker admits limited requests from slices of each binding counter that it leases in one
transaction (the counter's `reserved` holds every live lease), and beats every few seconds
with a snapshot of its requests in flight. When its beat stops, another worker releases its
leases and bills its requests for what they had relayed.
"""

TABLES = [
    """CREATE TABLE gateway_worker (id TEXT PRIMARY KEY, host TEXT NOT NULL, pid INTEGER NOT NULL,
        started {ts} NOT NULL, beat {ts} NOT NULL, inflight TEXT NOT NULL DEFAULT '[]')""",
    "CREATE INDEX gateway_worker_beat ON gateway_worker (beat)",
    """CREATE TABLE lease (id {pk}, worker TEXT NOT NULL, counter_id INTEGER NOT NULL,
        amount BIGINT NOT NULL DEFAULT 0)""",
    "CREATE UNIQUE INDEX lease_worker_counter ON lease (worker, counter_id)",
]


def up(db, sql):
    for statement in TABLES:
        db.execute_sql(sql(statement))


def down(db, sql):
    db.execute_sql("DROP TABLE lease")
    db.execute_sql("DROP TABLE gateway_worker")
