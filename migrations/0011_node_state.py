"""What the operator said about a node: ready, or cordoned (no new replicas)."""


def up(db, sql):
    db.execute_sql("ALTER TABLE node ADD COLUMN state TEXT NOT NULL DEFAULT 'ready'")


def down(db, sql):
    db.execute_sql("ALTER TABLE node DROP COLUMN state")
