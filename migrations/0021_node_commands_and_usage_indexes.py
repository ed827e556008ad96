"""What the control plane ran on each node: the command, its exit status (NULL: it did not
finish: no connection, a timeout), how long it took. The node page shows the newest; rows
older than a day are deleted (by their time: an index of its own).

Usage rows get indexes by time and by key and time: the cluster page counts the last minute's
requests every few seconds, and key listings show each key's last use. On a large usage table
this migration takes a while (one pass over it per index)."""


def up(db, sql):
    db.execute_sql(sql("""CREATE TABLE node_command (id {pk},
        node_id INTEGER NOT NULL REFERENCES node(id) ON DELETE CASCADE,
        created {ts} NOT NULL, command TEXT NOT NULL, exit_status INTEGER,
        seconds DOUBLE PRECISION NOT NULL DEFAULT 0, error TEXT NOT NULL DEFAULT '')"""))
    db.execute_sql("CREATE INDEX node_command_node_created ON node_command (node_id, created)")
    db.execute_sql("CREATE INDEX node_command_created ON node_command (created)")
    db.execute_sql("CREATE INDEX usage_created ON usage (created)")
    db.execute_sql("CREATE INDEX usage_key_created ON usage (key_id, created)")


def down(db, sql):
    db.execute_sql("DROP INDEX usage_key_created")
    db.execute_sql("DROP INDEX usage_created")
    db.execute_sql("DROP TABLE node_command")
