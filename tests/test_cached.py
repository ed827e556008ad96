"""db.cached: a value read from the database at most every ttl seconds, by one caller at a time."""
import threading

import peewee
import pytest

from llmgw.db import DatabaseAway, cached


def test_while_one_caller_reads_an_expired_value_the_others_go_on_with_the_old_one():
    entries, calls = {}, []
    assert cached(entries, "k", 0.0, lambda: "first") == "first"  # ttl 0: always expired
    reading, release = threading.Event(), threading.Event()

    def slow():
        calls.append(1)
        reading.set()
        release.wait(10)
        return "second"

    got = []
    reader = threading.Thread(target=lambda: got.append(cached(entries, "k", 5.0, slow)))
    entries["k"] = ("first", -100.0)  # read long ago
    reader.start()
    assert reading.wait(10)
    # Meanwhile others are answered at once, from the value being replaced; nobody reads again.
    assert [cached(entries, "k", 5.0, slow) for _ in range(20)] == ["first"] * 20
    release.set()
    reader.join(10)
    assert got == ["second"] and len(calls) == 1
    assert cached(entries, "k", 5.0, slow) == "second"


def test_a_read_that_fails_leaves_the_value_expired_for_the_next_caller():
    entries = {"k": ("old", -100.0)}

    def broken():
        raise ValueError("a bug, not the database away")
    with pytest.raises(ValueError):
        cached(entries, "k", 5.0, broken)
    assert cached(entries, "k", 5.0, lambda: "new") == "new"


def test_with_the_database_away_the_last_value_serves_and_a_value_never_read_fails_closed():
    def away():
        raise peewee.OperationalError("could not connect to server: Connection refused")
    entries = {"k": ("known", -100.0)}
    assert cached(entries, "k", 5.0, away) == "known"
    with pytest.raises(DatabaseAway, match="Connection refused"):
        cached(entries, "other", 5.0, away)
