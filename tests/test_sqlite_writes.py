"""SQLite transactions opened by llmgw hold the write lock from their first statement.

A transaction that reads and then writes, while another connection commits in between, must not
fail with "database is locked": that is how `model set` failed while the settlement thread wrote
usage rows in the same file."""
import sqlite3

import pytest

from llmgw.db import open_database


@pytest.fixture
def files(tmp_path):
    path = tmp_path / "llmgw.db"
    db = open_database(f"sqlite:///{path}")
    db.connect()
    db.execute_sql("CREATE TABLE model (name TEXT PRIMARY KEY, replicas INTEGER)")
    db.execute_sql("CREATE TABLE usage (n INTEGER)")
    db.execute_sql("INSERT INTO model VALUES ('demo', 4)")
    # The other writer waits for nothing, so a lock it meets shows at once.
    other = sqlite3.connect(str(path), timeout=0, isolation_level=None)
    yield db, other
    other.close()
    db.close()


def test_a_read_then_write_transaction_is_not_undercut_by_another_writer(files):
    db, other = files
    with db.atomic():
        (replicas,) = db.execute_sql("SELECT replicas FROM model WHERE name='demo'").fetchone()
        # Another writer arriving now waits its turn instead of committing under our read.
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("INSERT INTO usage VALUES (1)")
        db.execute_sql("UPDATE model SET replicas=? WHERE name='demo'", (replicas - 1,))
    assert other.execute("SELECT replicas FROM model").fetchone() == (3,)
    other.execute("INSERT INTO usage VALUES (1)")  # and it gets it once we are done
    assert other.execute("SELECT count(*) FROM usage").fetchone() == (1,)


def test_nested_blocks_and_explicit_transactions_take_the_lock_too(files):
    db, other = files
    with db.transaction():
        with db.atomic():  # a savepoint inside
            pass
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
    other.execute("BEGIN IMMEDIATE")
    other.execute("ROLLBACK")
