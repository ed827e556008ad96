"""A directory model's manifest (each file's path, size and sha256), and a copy's progress.

The manifest is what a tree copied to a node is checked against, file by file; the progress
(bytes done of the total, rate, time left) is shown on the replica's row while it is copied.
"""


def up(db, sql):
    db.execute_sql("ALTER TABLE model ADD COLUMN manifest TEXT")
    db.execute_sql("ALTER TABLE replica ADD COLUMN progress TEXT")


def down(db, sql):
    db.execute_sql("ALTER TABLE replica DROP COLUMN progress")
    db.execute_sql("ALTER TABLE model DROP COLUMN manifest")
