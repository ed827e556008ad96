"""The first schema: tenancy, keys, nodes, engine installs, models, replicas, log requests."""

TABLES = [
    """CREATE TABLE org (id {pk}, name TEXT NOT NULL UNIQUE, created {ts} NOT NULL)""",
    """CREATE TABLE team (id {pk}, org_id INTEGER NOT NULL REFERENCES org(id),
        name TEXT NOT NULL, created {ts} NOT NULL)""",
    """CREATE TABLE project (id {pk}, team_id INTEGER NOT NULL REFERENCES team(id),
        name TEXT NOT NULL UNIQUE, created {ts} NOT NULL)""",
    """CREATE TABLE "user" (id {pk}, email TEXT NOT NULL UNIQUE, password_hash TEXT NOT NULL,
        is_admin BOOLEAN NOT NULL, is_active BOOLEAN NOT NULL, created {ts} NOT NULL)""",
    """CREATE TABLE membership (id {pk}, user_id INTEGER NOT NULL REFERENCES "user"(id),
        project_id INTEGER NOT NULL REFERENCES project(id))""",
    """CREATE TABLE api_key (id {pk}, project_id INTEGER NOT NULL REFERENCES project(id),
        user_id INTEGER REFERENCES "user"(id), name TEXT NOT NULL, prefix TEXT NOT NULL,
        key_hash TEXT NOT NULL UNIQUE, created {ts} NOT NULL, expires {ts}, revoked {ts})""",
    """CREATE TABLE node (id {pk}, name TEXT NOT NULL UNIQUE, transport TEXT NOT NULL,
        addr TEXT NOT NULL, port INTEGER NOT NULL, ssh_user TEXT NOT NULL, host_key TEXT NOT NULL,
        host_key_fp TEXT NOT NULL, base_dir TEXT NOT NULL, facts TEXT, reachable BOOLEAN NOT NULL,
        last_seen {ts}, last_error TEXT NOT NULL, created {ts} NOT NULL)""",
    """CREATE TABLE engine_install (id {pk},
        node_id INTEGER NOT NULL REFERENCES node(id) ON DELETE CASCADE,
        engine TEXT NOT NULL, version TEXT NOT NULL, variant TEXT NOT NULL, state TEXT NOT NULL,
        detail TEXT NOT NULL, "binary" TEXT NOT NULL, updated {ts} NOT NULL,
        next_check {ts} NOT NULL, failures INTEGER NOT NULL)""",
    """CREATE UNIQUE INDEX engine_install_node_engine ON engine_install (node_id, engine)""",
    """CREATE TABLE model (id {pk}, name TEXT NOT NULL UNIQUE, engine TEXT NOT NULL,
        source TEXT NOT NULL, sha256 TEXT NOT NULL, replicas INTEGER NOT NULL, args TEXT,
        created {ts} NOT NULL)""",
    """CREATE TABLE replica (id {pk}, name TEXT NOT NULL UNIQUE,
        model_id INTEGER NOT NULL REFERENCES model(id) ON DELETE CASCADE,
        node_id INTEGER NOT NULL REFERENCES node(id) ON DELETE CASCADE,
        port INTEGER NOT NULL, supervisor TEXT NOT NULL, state TEXT NOT NULL,
        detail TEXT NOT NULL, endpoint TEXT NOT NULL, updated {ts} NOT NULL)""",
    """CREATE INDEX replica_model_state ON replica (model_id, state)""",
    """CREATE TABLE log_request (id {pk},
        node_id INTEGER NOT NULL REFERENCES node(id) ON DELETE CASCADE,
        source TEXT NOT NULL, cursor TEXT NOT NULL, lines INTEGER NOT NULL, state TEXT NOT NULL,
        result TEXT, next_cursor TEXT NOT NULL, created {ts} NOT NULL)""",
    """CREATE INDEX log_request_state ON log_request (state)""",
]

DROP = ["log_request", "replica", "model", "engine_install", "node", "api_key", "membership",
        '"user"', "project", "team", "org"]


def up(db, sql):
    for statement in TABLES:
        db.execute_sql(sql(statement))


def down(db, sql):
    for table in DROP:
        db.execute_sql(f"DROP TABLE {table}")
