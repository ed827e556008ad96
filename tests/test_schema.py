"""The schema the migrations build is the one the models describe: every table, column, type
family, nullability and unique index, on SQLite and (with LLMGW_TEST_POSTGRES) PostgreSQL."""
import peewee

from llmgw import migrate, models
from llmgw.models import database

FAMILY = {  # peewee field -> what the database calls its type, lower-cased, by family
    "AutoField": "int", "IntegerField": "int", "ForeignKeyField": "int", "BigIntegerField": "bigint",
    "TextField": "text", "JSONField": "text", "DateTimeField": "timestamp", "BooleanField": "bool",
    "FloatField": "float",
}
DB_FAMILY = {"integer": "int", "int": "int", "int4": "int", "bigint": "bigint", "int8": "bigint",
             "text": "text", "datetime": "timestamp", "timestamp": "timestamp",
             "timestamp without time zone": "timestamp", "boolean": "bool", "bool": "bool",
             "real": "float", "double precision": "float", "float": "float"}


def tables():
    return [m for m in models.Base.__subclasses__()]


def test_the_migrated_schema_is_the_models_schema(app):
    db = database.obj
    assert migrate.upgrade(db) == []  # the app fixture migrated: nothing is left
    problems = []
    for model in tables():
        table = model._meta.table_name
        columns = {c.name: c for c in db.get_columns(table)}
        fields = {f.column_name: f for f in model._meta.sorted_fields}
        for name in sorted(set(columns) ^ set(fields)):
            problems.append(f"{table}.{name}: only in the {'models' if name in fields else 'database'}")
        for name in sorted(set(columns) & set(fields)):
            c, f = columns[name], fields[name]
            want = FAMILY[type(f).__name__]
            got = DB_FAMILY.get(c.data_type.lower(), c.data_type.lower())
            if got != want:
                problems.append(f"{table}.{name}: {c.data_type} in the database, {type(f).__name__} in the models")
            if not c.primary_key and c.null != f.null:
                problems.append(f"{table}.{name}: {'NULL' if c.null else 'NOT NULL'} in the database, "
                                f"null={f.null} in the models")
        unique = {tuple(i.columns) for i in db.get_indexes(table) if i.unique}
        unique |= {tuple(k) for k in _primary_and_constraints(db, table)}
        for f in model._meta.sorted_fields:
            if f.unique and (f.column_name,) not in unique:
                problems.append(f"{table}.{f.column_name}: unique in the models, not in the database")
        for fields_of, is_unique in model._meta.indexes:
            names = tuple(model._meta.fields[n].column_name for n in fields_of)
            if is_unique and names not in unique:
                problems.append(f"{table}{names}: a unique index in the models, not in the database")
    assert not problems, "\n".join(problems)


def _primary_and_constraints(db, table):
    if isinstance(db, peewee.PostgresqlDatabase):
        rows = db.execute_sql(
            "SELECT array_agg(a.attname ORDER BY k.ord) FROM pg_constraint c "
            "CROSS JOIN LATERAL unnest(c.conkey) WITH ORDINALITY AS k(attnum, ord) "
            "JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = k.attnum "
            "WHERE c.conrelid = %s::regclass AND c.contype IN ('u', 'p') GROUP BY c.oid", (table,))
        return [tuple(r[0]) for r in rows]
    return [tuple(c.name for c in db.get_columns(table) if c.primary_key)]


def test_null_json_columns_written_before_become_the_models_defaults(app):
    from llmgw.models import Model, Node
    db = database.obj
    Node.create(name="old")
    Model.create(name="m", engine="sim", source="x", sha256="", replicas=1)
    migrate.downgrade(db, 16)
    db.execute_sql("UPDATE node SET facts = NULL, addrs = NULL, labels = NULL, fabric_hcas = NULL")
    db.execute_sql("UPDATE model SET args = NULL")
    assert migrate.upgrade(db)[0] == "0017_json_columns_not_null"
    node, model = Node.get(Node.name == "old"), Model.get(Model.name == "m")
    assert (node.facts, node.addrs, node.labels, node.fabric_hcas, model.args) == ({}, [], {}, [], [])
