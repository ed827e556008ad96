"""Settle finished requests off the request path, many in one transaction.

A response ends by handing its numbers to the worker's Settlement and returning; a
background thread (a greenlet under gevent) settles what has gathered every FLUSH_SECONDS:
one transaction moves every reservation to what was really used and inserts every usage
row. Until then a reservation stays held, so a limit can only be stricter for those
milliseconds, never looser. Counter rows are updated in one fixed order (the order in
which admission locks them), so two control planes on PostgreSQL cannot deadlock.
"""
import atexit
import collections
import contextlib
import logging
import os
import threading
import time

import peewee

from ..models import Counter, Usage, database, utcnow
from ..plans import quota
from .quota import transaction

log = logging.getLogger("llmgw.settlement")
FLUSH_SECONDS = 0.1
MAX_BATCH = 1000
IDLE_EXIT_SECONDS = 30
MAX_PENDING = 100_000  # while the database is away; beyond this the oldest usage rows are dropped


# What the database refuses for one request's values (not for being away): given up on alone.
REFUSED = (peewee.DataError, peewee.IntegrityError)
TOKENS_MAX = 2**31 - 1  # the usage columns are 4-byte integers on PostgreSQL


class Settlement:
    def __init__(self, flush_seconds=FLUSH_SECONDS):
        self.flush_seconds = flush_seconds
        self.pending = collections.deque()
        self.lock = threading.Lock()        # guards pending
        self.writing = threading.Lock()     # held while a batch is taken and written
        self.thread = None
        self.pid = None
        self.dropped = 0
        self.failing_since = None
        self.uncertain = set()  # request ids of batches that failed: perhaps committed after all
        self.closed = False
        atexit.register(self.close)

    def add(self, res, prompt_tokens, completion_tokens, status, endpoint=""):
        """Queue one finished request; return its real cost."""
        # An engine's word is clamped to what the columns hold: one absurd number must not
        # make a batch the database refuses for ever.
        prompt_tokens = max(0, min(int(prompt_tokens), TOKENS_MAX))
        completion_tokens = max(0, min(int(completion_tokens), TOKENS_MAX))
        actual = quota.cost(prompt_tokens, completion_tokens, res.price)
        item = (res, prompt_tokens, completion_tokens, actual, status, endpoint,
                int((time.monotonic() - res.started) * 1000), utcnow())
        with self.lock:
            self.pending.append(item)
            if len(self.pending) > MAX_PENDING:
                # The database has been away a long while. Dropping the oldest loses its usage
                # row and leaves its reservation held: limits err on the strict side.
                self.pending.popleft()
                self.dropped += 1
                if self.dropped % 1000 == 1:
                    log.error("%d finished requests wait to be settled and the database takes "
                              "none; %d dropped so far", MAX_PENDING, self.dropped)
            if self.closed:
                return actual  # only at exit, after close() settled: written by nobody
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
        """Settle what is left and stop the thread (a worker's exit, the end of a test); waits
        for a batch being written."""
        self.closed = True
        atexit.unregister(self.close)
        self.flush()
        if self.pending:
            log.error("%d finished requests could not be settled before exit: their usage rows "
                      "are lost and their reservations stay held until their windows end",
                      len(self.pending))

    def flush(self):
        """Settle everything queued now; return how many requests left the queue."""
        done = 0
        with self.writing:
            while True:
                with self.lock:
                    batch = [self.pending.popleft() for _ in range(min(MAX_BATCH, len(self.pending)))]
                if not batch:
                    return done
                taken = len(batch)
                try:
                    if self.uncertain:
                        batch = self._not_yet_written(batch)
                    _write(batch)
                except Exception as e:
                    kept = self._one_by_one(batch, e)
                    done += taken - len(kept)
                    if kept:
                        with self.lock:
                            self.pending.extendleft(reversed(kept))
                        return done
                    continue
                if self.failing_since is not None:
                    log.warning("settling works again after %.0f s",
                                time.monotonic() - self.failing_since)
                    self.failing_since = None
                done += taken

    def _not_yet_written(self, batch):
        """Leave out the requests of a batch that failed before but whose commit the database
        applied all the same (its answer was lost with the connection): settled once only."""
        ids = [item[0].request_id for item in batch if item[0].request_id in self.uncertain]
        if not ids:
            return batch
        with _connected():
            written = {row.request_id for row in Usage.select(Usage.request_id).where(
                Usage.request_id.in_(ids))}
        self.uncertain.difference_update(ids)
        if written:
            log.warning("%d requests were settled by a commit whose answer was lost; they are "
                        "not settled again", len(written))
        return [item for item in batch if item[0].request_id not in written]

    def _one_by_one(self, batch, error):
        """A batch failed: unless the database is away (then all are kept), write its requests
        one at a time; one the database refuses by itself is logged and let go. Return those to
        try again."""
        if not isinstance(error, REFUSED):
            self._failing(error, len(batch), batch)
            return batch  # the database itself is away (or its schema is): keep all, in order
        for i, item in enumerate(batch):
            try:
                _write([item])
            except REFUSED:
                res = item[0]
                log.exception("the database refuses to settle one request (key %s, model %r, "
                              "%s prompt and %s completion tokens); its usage row is lost and its "
                              "reservation stays held until its window ends",
                              res.key_id, res.model, item[1], item[2])
            except Exception as e:
                self._failing(e, len(batch) - i, batch[i:])
                return batch[i:]
        return []

    def _failing(self, error, count, batch=()):
        self.uncertain.update(item[0].request_id for item in batch)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.error("settling %d requests failed (%s); their reservations stay held and they "
                      "are tried again until the database takes them", count, str(error).strip())


USAGE_COLUMNS = ("key_id", "project_id", "model", "prompt_tokens", "completion_tokens", "cost",
                 "latency_ms", "status", "endpoint", "created", "request_id")


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
    with peewee.__exception_wrapper__:  # the driver's errors as peewee's, as for other queries
        db.cursor().executemany(sql, rows)


def _write(batch):
    # (lock order, counter id) -> [change of reserved, change of used]
    deltas = collections.defaultdict(lambda: [0, 0])
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
                     status, endpoint, _stamp(ended), res.request_id))
    with _connected(), transaction():
        for (_, counter_id), (reserved, used) in sorted(deltas.items()):
            Counter.update(reserved=Counter.reserved + reserved, used=Counter.used + used).where(
                Counter.id == counter_id).execute()
        _insert_usage(rows)


@contextlib.contextmanager
def _connected():
    """This thread's connection for the block, given back after unless it was open before."""
    opened = database.is_closed()
    if opened:
        database.connect()
    try:
        yield
    finally:
        if opened:
            database.close()
