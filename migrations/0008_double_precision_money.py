"""Money and token counters as 8-byte floats on PostgreSQL too.

SQLite's REAL is already a double; PostgreSQL's is a 4-byte float, on which a reservation
of 0.1 released again left 1e-09 behind and a budget drifted. Nothing changes on SQLite.
"""
import peewee

COLUMNS = [("limit_rule", "budget"), ("price", "prompt_per_1k"), ("price", "completion_per_1k"),
           ("counter", "used"), ("counter", "reserved"), ("usage", "cost"), ("replica", "load")]


def up(db, sql):
    if isinstance(db, peewee.PostgresqlDatabase):
        for table, column in COLUMNS:
            db.execute_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE DOUBLE PRECISION")


def down(db, sql):
    if isinstance(db, peewee.PostgresqlDatabase):
        for table, column in COLUMNS:
            db.execute_sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE REAL")
