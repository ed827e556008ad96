"""Onboarding details per node (addresses, sudo, labels, fabric, interface), its event log,
and a replica's count of failed starts (for backing off)."""

COLUMNS = [
    ("addrs", "TEXT"),            # JSON list of HOST[:PORT], tried in order
    ("labels", "TEXT"),           # JSON object
    ("fabric", "TEXT NOT NULL DEFAULT ''"),
    ("fabric_hcas", "TEXT"),      # JSON list
    ("mgmt_interface", "TEXT NOT NULL DEFAULT ''"),
    ("use_sudo", "BOOLEAN NOT NULL DEFAULT FALSE"),
    ("discovered", "{ts}"),
]


def up(db, sql):
    for name, kind in COLUMNS:
        db.execute_sql(sql(f"ALTER TABLE node ADD COLUMN {name} {kind}"))
    db.execute_sql(sql("""CREATE TABLE node_event (id {pk},
        node_id INTEGER NOT NULL REFERENCES node(id) ON DELETE CASCADE,
        created {ts} NOT NULL, text TEXT NOT NULL)"""))
    db.execute_sql("CREATE INDEX node_event_node_created ON node_event (node_id, created)")
    db.execute_sql("ALTER TABLE replica ADD COLUMN failures INTEGER NOT NULL DEFAULT 0")


def down(db, sql):
    db.execute_sql("ALTER TABLE replica DROP COLUMN failures")
    db.execute_sql("DROP TABLE node_event")
    for name, _ in reversed(COLUMNS):
        db.execute_sql(f"ALTER TABLE node DROP COLUMN {name}")
