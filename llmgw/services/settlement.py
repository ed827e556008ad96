"""Settle finished requests off the request path, many in one transaction.

A response ends by handing its numbers to the worker's Settlement and returning; a
background thread (a greenlet under gevent) settles what has gathered every FLUSH_SECONDS:
one transaction moves every reservation to what was really used and inserts every usage
row. Until then a reservation stays held, so a limit can only be stricter for those
milliseconds, never looser. Counter rows are updated in one fixed order (the order in
which admission locks them), so two control planes on PostgreSQL cannot deadlock.
"""
import atexit
import logging
import os
import threading
import time
from collections import defaultdict

import peewee

from ..models import Counter, Usage, database, utcnow
from ..plans import quota
from .quota import transaction

log = logging.getLogger("llmgw.settlement")
FLUSH_SECONDS = 0.1
MAX_BATCH = 1000
IDLE_EXIT_SECONDS = 30
MAX_PENDING = 100_000  # while the database is away; beyond this the oldest usage rows are dropped


class Settlement:
    def __init__(self, flush_seconds=FLUSH_SECONDS):
        self.flush_seconds = flush_seconds
        self.pending = []
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.thread = None
        self.pid = None
        self.dropped = 0
        self.failing_since = None
        self.closed = False
        atexit.register(self.close)

    def add(self, res, prompt_tokens, completion_tokens, status, endpoint=""):
        """Queue one finished request; return its real cost."""
        actual = quota.cost(prompt_tokens, completion_tokens, res.price)
        item = (res, prompt_tokens, completion_tokens, actual, status, endpoint,
                int((time.monotonic() - res.started) * 1000), utcnow())
        with self.lock:
            self.pending.append(item)
            if len(self.pending) > MAX_PENDING:
                # The database has been away a long while. Dropping the oldest loses its usage
                # row and leaves its reservation held: limits err on the strict side.
                self.pending.pop(0)
                self.dropped += 1
                if self.dropped % 1000 == 1:
                    log.error("%d finished requests wait to be settled and the database takes "
                              "none; %d dropped so far", MAX_PENDING, self.dropped)
            self._ensure_thread()
        return actual

    def _ensure_thread(self):
        if self.thread is None or not self.thread.is_alive() or self.pid != os.getpid():
            self.pid = os.getpid()  # a forked worker needs a thread of its own
            self.thread = threading.Thread(target=self._run, name="llmgw-settlement", daemon=True)
            self.thread.start()

    def _run(self):
        idle_since = time.monotonic()
        while not self.closed:
            # While the database refuses batches, try again less and less often (up to 5 s).
            backoff = min(5.0, time.monotonic() - self.failing_since) if self.failing_since else 0
            time.sleep(max(self.flush_seconds, backoff))
            if self.flush():
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > IDLE_EXIT_SECONDS:
                with self.lock:
                    if not self.pending:
                        self.thread = None
                        return

    def close(self):
        """Settle what is left and stop the thread (a worker's exit, the end of a test)."""
        self.closed = True
        self.flush()

    def flush(self):
        """Settle everything queued now; return how many requests were settled."""
        done = 0
        while True:
            with self.lock:
                batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            if not batch:
                return done
            try:
                _write(batch)
            except Exception as e:
                if self.failing_since is None:
                    self.failing_since = time.monotonic()
                    log.exception("settling %d requests failed; their reservations stay held "
                                  "and they are tried again until the database takes them", len(batch))
                else:
                    log.debug("settling still fails: %s", e)
                with self.lock:
                    self.pending[:0] = batch
                return done
            if self.failing_since is not None:
                log.warning("settling works again after %.0f s", time.monotonic() - self.failing_since)
                self.failing_since = None
            done += len(batch)


USAGE_COLUMNS = ("key_id", "project_id", "model", "prompt_tokens", "completion_tokens", "cost",
                 "latency_ms", "status", "endpoint", "created")


def _stamp(when):
    # What peewee stores for a DateTimeField: SQLite keeps text, PostgreSQL a timestamp.
    return str(when) if isinstance(database.obj, peewee.SqliteDatabase) else when


def _insert_usage(rows):
    """One prepared INSERT run for every row (peewee would build the SQL text row by row)."""
    if not rows:
        return
    db = database.obj
    marks = ", ".join([db.param] * len(USAGE_COLUMNS))
    sql = f'INSERT INTO "{Usage._meta.table_name}" ({", ".join(USAGE_COLUMNS)}) VALUES ({marks})'
    db.cursor().executemany(sql, rows)


def _write(batch):
    deltas = defaultdict(lambda: [0, 0])  # (order, counter id) -> [reserved change, used change]
    rows = []  # in USAGE_COLUMNS order
    for res, prompt, completion, actual, status, endpoint, latency, ended in batch:
        for order, counter_id, what in res.counters:
            if what == "tpm":
                d = deltas[(order, counter_id)]
                d[0] -= res.tokens
                d[1] += prompt + completion
            elif what == "budget":
                d = deltas[(order, counter_id)]
                d[0] -= res.cost
                d[1] += actual
        rows.append((res.key_id, res.project_id, res.model, prompt, completion, actual, latency,
                     status, endpoint, _stamp(ended)))
    opened = database.is_closed()
    if opened:
        database.connect()
    try:
        with transaction():
            for (_, counter_id), (reserved, used) in sorted(deltas.items()):
                Counter.update(reserved=Counter.reserved + reserved, used=Counter.used + used).where(
                    Counter.id == counter_id).execute()
            _insert_usage(rows)
    finally:
        if opened:
            database.close()
