"""What the control plane ran on each node: the command, its exit status (NULL: it did not
finish: no connection, a timeout), how long it took. The node page shows the newest; rows
older than a day are deleted."""


def up(db, sql):
    db.execute_sql(sql("""CREATE TABLE node_command (id {pk},
        node_id INTEGER NOT NULL REFERENCES node(id) ON DELETE CASCADE,
        created {ts} NOT NULL, command TEXT NOT NULL, exit_status INTEGER,
        seconds DOUBLE PRECISION NOT NULL DEFAULT 0, error TEXT NOT NULL DEFAULT '')"""))
    db.execute_sql("CREATE INDEX node_command_node_created ON node_command (node_id, created)")


def down(db, sql):
    db.execute_sql("DROP TABLE node_command")
