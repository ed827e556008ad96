"""The JSON columns the models always fill are NOT NULL in the database too.

node.facts, addrs, labels and fabric_hcas and model.args were created nullable while the
models never store NULL in them; a row written by hand (or by an older version) with NULL
there read back as None where the code expects a list or an object. NULLs become the
models' defaults.
"""
import peewee

# (table, column, what a NULL becomes)
COLUMNS = [("node", "facts", "{}"), ("node", "addrs", "[]"), ("node", "labels", "{}"),
           ("node", "fabric_hcas", "[]"), ("model", "args", "[]")]


def _set_null(db, table, column, empty, nullable):
    if isinstance(db, peewee.PostgresqlDatabase):
        db.execute_sql(f"UPDATE {table} SET {column} = '{empty}' WHERE {column} IS NULL")
        db.execute_sql(f"ALTER TABLE {table} ALTER COLUMN {column} "
                       + ("DROP NOT NULL" if nullable else "SET NOT NULL"))
        return
    # SQLite cannot change a column's constraint: a new column takes the values, then its name.
    rest = "" if nullable else f" NOT NULL DEFAULT '{empty}'"
    db.execute_sql(f"ALTER TABLE {table} ADD COLUMN {column}_new TEXT{rest}")
    db.execute_sql(f"UPDATE {table} SET {column}_new = COALESCE({column}, '{empty}')")
    db.execute_sql(f"ALTER TABLE {table} DROP COLUMN {column}")
    db.execute_sql(f"ALTER TABLE {table} RENAME COLUMN {column}_new TO {column}")


def up(db, sql):
    for table, column, empty in COLUMNS:
        _set_null(db, table, column, empty, nullable=False)


def down(db, sql):
    for table, column, empty in COLUMNS:
        _set_null(db, table, column, empty, nullable=True)
