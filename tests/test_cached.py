"""db.cached: a value read from the database at most every ttl seconds, by one caller at a time;
the others wait for that read instead of running it again, and never get a value past its ttl
while the database answers."""
import threading

import peewee
import pytest

from llmgw.db import DatabaseAway, cached


def test_callers_that_find_a_value_expired_while_it_is_read_wait_for_that_read():
    entries, reading, calls = {"k": ("old", -100.0)}, {}, []  # read long ago
    started, release = threading.Event(), threading.Event()

    def slow():
        calls.append(1)
        started.set()
        release.wait(10)
        return "new"

    got = []
    callers = [threading.Thread(target=lambda: got.append(cached(entries, reading, "k", 5.0, slow)))
               for _ in range(20)]
    callers[0].start()
    assert started.wait(10)
    for t in callers[1:]:
        t.start()
    release.set()
    for t in callers:
        t.join(10)
    # One read; nobody was answered with the value whose time was up (a limit set since binds).
    assert got == ["new"] * 20 and len(calls) == 1 and not reading


def test_a_read_that_fails_leaves_the_value_expired_for_the_next_caller():
    entries, reading = {"k": ("old", -100.0)}, {}

    def broken():
        raise ValueError("a bug, not the database away")
    with pytest.raises(ValueError):
        cached(entries, reading, "k", 5.0, broken)
    assert cached(entries, reading, "k", 5.0, lambda: "new") == "new"


def test_with_the_database_away_the_last_value_serves_and_a_value_never_read_fails_closed():
    def away():
        raise peewee.OperationalError("could not connect to server: Connection refused")
    entries, reading = {"k": ("known", -100.0)}, {}
    assert cached(entries, reading, "k", 5.0, away) == "known"
    with pytest.raises(DatabaseAway, match="Connection refused"):
        cached(entries, reading, "other", 5.0, away)
