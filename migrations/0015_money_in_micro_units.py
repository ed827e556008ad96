"""Money as whole micro-units; rpm/tpm in 5-second buckets; spend counted for every scope.

Budgets, prices (per 1k tokens), usage costs and budget counters were floats in the currency,
which drifted (a reservation of 0.1 released again left 1e-09 behind) and needed tolerances.
They become 8-byte integers of micro-units (values x 1,000,000, rounded).

Spend is now counted for every scope in every budget period, limited or not, so that a budget
set mid-period finds what was spent before it. The current day, week, month and all-time
counters are filled from the usage rows here. The old per-minute rpm/tpm rows are dropped:
they describe at most the last minute, and their format is gone.
"""
import datetime

import peewee

# (table, column, nullable)
COLUMNS = [("limit_rule", "budget", True), ("price", "prompt_per_1k", False),
           ("price", "completion_per_1k", False), ("usage", "cost", False),
           ("counter", "used", False), ("counter", "reserved", False)]


def _to_micros(db, table, column, nullable):
    # Only budget counters hold money; rpm/tpm rows are deleted below before this runs.
    scaled = f"CAST(ROUND({column} * 1000000) AS BIGINT)"
    if isinstance(db, peewee.PostgresqlDatabase):
        db.execute_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE BIGINT USING {scaled}")
        return
    # SQLite keeps a column's declared type: a REAL column would turn integers back into floats.
    rest = "" if nullable else " NOT NULL DEFAULT 0"
    db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {column}_micros BIGINT{rest}")
    db.execute_sql(f"UPDATE {table} SET {column}_micros = {scaled}")
    db.execute_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.execute_sql(f"ALTER TABLE {table} RENAME COLUMN {column}_micros TO {column}")


def _periods(now):
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    year, week, _ = now.isocalendar()
    return [(now.strftime("%Y-%m-%d"), day),
            (f"{year}-W{week:02d}", day - datetime.timedelta(days=now.weekday())),
            (now.strftime("%Y-%m"), day.replace(day=1)),
            ("all", datetime.datetime(1970, 1, 1))]


def _seed_spend(db):
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    postgres = isinstance(db, peewee.PostgresqlDatabase)
    have = {tuple(r) for r in db.execute_sql(
        "SELECT scope_kind, scope_id, slot FROM counter WHERE kind = 'budget'").fetchall()}
    for slot, start in _periods(now):
        rows = db.execute_sql(
            "SELECT u.key_id, u.project_id, p.team_id, t.org_id, SUM(u.cost) FROM usage u "
            "JOIN project p ON p.id = u.project_id JOIN team t ON t.id = p.team_id "
            f"WHERE u.created >= {db.param} GROUP BY u.key_id, u.project_id, p.team_id, t.org_id",
            (start if postgres else str(start),)).fetchall()
        spent = {}
        for key_id, project_id, team_id, org_id, cost in rows:
            for scope in (("key", key_id), ("project", project_id), ("team", team_id), ("org", org_id)):
                if scope[1] is not None:
                    spent[scope] = spent.get(scope, 0) + int(cost or 0)
        for (kind, sid), used in sorted(spent.items()):
            if (kind, sid, slot) not in have:
                db.execute_sql("INSERT INTO counter (scope_kind, scope_id, kind, slot, used, reserved) "
                               f"VALUES ({db.param}, {db.param}, 'budget', {db.param}, {db.param}, 0)",
                               (kind, sid, slot, used))


def up(db, sql):
    db.execute_sql("DELETE FROM counter WHERE kind IN ('rpm', 'tpm')")
    for table, column, nullable in COLUMNS:
        _to_micros(db, table, column, nullable)
    _seed_spend(db)


def down(db, sql):
    db.execute_sql("DELETE FROM counter WHERE kind <> 'budget'")
    for table, column, nullable in COLUMNS:
        if isinstance(db, peewee.PostgresqlDatabase):
            db.execute_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE DOUBLE PRECISION "
                           f"USING {column} / 1000000.0")
        else:
            rest = "" if nullable else " NOT NULL DEFAULT 0"
            db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {column}_real REAL{rest}")
            db.execute_sql(f"UPDATE {table} SET {column}_real = {column} / 1000000.0")
            db.execute_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
            db.execute_sql(f"ALTER TABLE {table} RENAME COLUMN {column}_real TO {column}")
