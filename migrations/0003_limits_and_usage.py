"""Limits and budgets per scope, prices per model, counters per window, usage per request."""

TABLES = [
    """CREATE TABLE limit_rule (id {pk}, scope_kind TEXT NOT NULL, scope_id INTEGER NOT NULL,
        rpm INTEGER, tpm INTEGER, budget REAL, period TEXT NOT NULL DEFAULT 'month')""",
    "CREATE UNIQUE INDEX limit_rule_scope ON limit_rule (scope_kind, scope_id)",
    """CREATE TABLE price (id {pk}, model TEXT NOT NULL UNIQUE, prompt_per_1k REAL NOT NULL,
        completion_per_1k REAL NOT NULL)""",
    """CREATE TABLE counter (id {pk}, scope_kind TEXT NOT NULL, scope_id INTEGER NOT NULL,
        kind TEXT NOT NULL, slot TEXT NOT NULL, used REAL NOT NULL DEFAULT 0,
        reserved REAL NOT NULL DEFAULT 0)""",
    "CREATE UNIQUE INDEX counter_scope_slot ON counter (scope_kind, scope_id, kind, slot)",
    """CREATE TABLE usage (id {pk}, created {ts} NOT NULL, key_id INTEGER, project_id INTEGER NOT NULL,
        model TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
        cost REAL NOT NULL, latency_ms INTEGER NOT NULL, status INTEGER NOT NULL,
        endpoint TEXT NOT NULL)""",
    "CREATE INDEX usage_project_created ON usage (project_id, created)",
    "ALTER TABLE api_key ADD COLUMN models TEXT",
]


def up(db, sql):
    for statement in TABLES:
        db.execute_sql(sql(statement))


def down(db, sql):
    db.execute_sql("ALTER TABLE api_key DROP COLUMN models")
    for table in ("usage", "counter", "price", "limit_rule"):
        db.execute_sql(f"DROP TABLE {table}")
