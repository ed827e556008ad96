"""Settle finished requests off the request path, many in one transaction.

A response ends by handing its numbers to the worker's Settlement and returning; a
background thread (a greenlet under gevent) settles what has gathered every FLUSH_SECONDS:
one transaction moves every reservation to what was really used and inserts every usage
row. Until then a reservation stays held, so a limit can only be stricter for those
milliseconds, never looser. Counter rows are updated in one fixed order (the order in
which admission locks them), so two control planes on PostgreSQL cannot deadlock.
"""
import atexit
import datetime
import collections
import contextlib
import logging
import os
import threading
import time

import peewee
from peewee import fn

from ..models import Counter, Usage, database, utcnow
from ..plans import quota
from .quota import KIND_ORDER, transaction

log = logging.getLogger("llmgw.settlement")
FLUSH_SECONDS = 0.1
MAX_BATCH = 1000
IDLE_EXIT_SECONDS = 30
PRUNE_SECONDS = 300
BUCKETS_KEPT_SECONDS = 600  # rpm/tpm buckets older than this are deleted
REFUSED_KEPT_DAYS = 90
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
        self.refusals = collections.Counter()  # (key id, OpenAI error type, day) -> requests
        self.pruned_at = 0.0
        atexit.register(self.close)

    def refused(self, key_id, kind, when=None):
        """Count a request turned away with a 429 (rpm, tpm or budget) against its key's day."""
        day = (when or utcnow()).strftime("%Y-%m-%d")
        with self.lock:
            self.refusals[(key_id, kind, day)] += 1
            if not self.closed:
                self._ensure_thread()

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
            if time.monotonic() - self.pruned_at > PRUNE_SECONDS and not self.failing_since:
                self.pruned_at = time.monotonic()
                try:
                    prune()
                except Exception as e:  # the next pass tries again; nothing depends on it
                    log.warning("pruning old counters failed: %s", e)
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
                    refused, self.refusals = self.refusals, collections.Counter()
                if not batch and not refused:
                    return done
                taken = len(batch)
                try:
                    if self.uncertain:
                        batch = self._not_yet_written(batch)
                    _write(batch, list(refused.elements()))
                except Exception as e:
                    with self.lock:
                        self.refusals.update(refused)  # counted with a later batch
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


def _write(batch, refused=()):
    """Settle a batch in one transaction: every reservation moves to what was used, every scope
    of every request counts its request, tokens and cost (limited or not), usage rows go in.

    refused: ((key id, OpenAI error type, day), …) of requests turned away with a 429.
    """
    # (lock order, scope kind, scope id, kind, slot) -> [change of reserved, change of used, row id]
    changes = collections.defaultdict(lambda: [0, 0, None])
    rows = []  # in USAGE_COLUMNS order
    for res, prompt, completion, actual, status, endpoint, latency, ended in batch:
        for order, counter_id, what, slot in res.counters:
            c = changes[(order, *res.scopes[order[0]], what, slot)]
            c[2] = counter_id
            if what == "tpm":
                c[0] -= res.tokens
                c[1] += prompt + completion
            elif what == "budget":
                c[0] -= res.cost
                c[1] += actual
        _count_everywhere(changes, res, prompt + completion, actual)
        rows.append((res.key_id, res.project_id, res.model, prompt, completion, actual, latency,
                     status, endpoint, _stamp(ended), res.request_id))
    for key_id, kind, day in refused:
        changes[((0, key_id, KIND_ORDER["refused"]), "key", key_id, f"refused_{kind}", day)][1] += 1
    with _connected(), transaction():
        # Sorted as admission locks rows (scope, kind, slot): two writers never wait in a circle.
        for (_, scope_kind, scope_id, kind, slot), (reserved, used, row) in sorted(changes.items()):
            if row is not None and (reserved or used):
                Counter.update(reserved=Counter.reserved + reserved,
                               used=Counter.used + used).where(Counter.id == row).execute()
            elif used:
                Counter.insert(scope_kind=scope_kind, scope_id=scope_id, kind=kind, slot=slot,
                               used=used).on_conflict(
                    conflict_target=[Counter.scope_kind, Counter.scope_id, Counter.kind, Counter.slot],
                    update={Counter.used: Counter.used + used}).execute()
        _insert_usage(rows)


def _count_everywhere(changes, res, tokens, cost):
    """Count a request in its scopes' rpm and tpm buckets and in all four budget periods,
    where its reservation does not already count it; those rows are in changes already."""
    if not res.scopes or res.admitted is None:
        return
    bucket = quota.bucket_slot(res.admitted)
    counts = [("rpm", bucket, 1), ("tpm", bucket, tokens)]
    counts += [("budget", slot, cost) for slot in quota.budget_slots(res.admitted).values()]
    reserved = {(order[0], what, slot) for order, _, what, slot in res.counters}
    for rank, (scope_kind, scope_id) in enumerate(res.scopes):
        for kind, slot, amount in counts:
            if amount and (rank, kind, slot) not in reserved:
                changes[((rank, scope_id, KIND_ORDER[kind]), scope_kind, scope_id, kind, slot)][1] += amount


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


def prune(now=None):
    """Delete counter rows of windows that are over: rpm/tpm buckets past BUCKETS_KEPT_SECONDS,
    budget periods before the previous one (usage rows keep the history), refusal counts past
    REFUSED_KEPT_DAYS. A row that still holds a reservation stays. Return how many went."""
    now = now or utcnow()
    old_bucket = quota.bucket_slot(now - datetime.timedelta(seconds=BUCKETS_KEPT_SECONDS))
    periods = [(10, quota.budget_slot("day", now - datetime.timedelta(days=1))),
               (8, quota.budget_slot("week", now - datetime.timedelta(days=7))),
               (7, quota.budget_slot("month", now.replace(day=1) - datetime.timedelta(days=1)))]
    old = ((Counter.kind.in_(["rpm", "tpm"])) & (Counter.slot < old_bucket))
    for length, slot in periods:
        old |= ((Counter.kind == "budget") & (fn.LENGTH(Counter.slot) == length) & (Counter.slot < slot))
    refused = (now - datetime.timedelta(days=REFUSED_KEPT_DAYS)).strftime("%Y-%m-%d")
    old |= (Counter.kind.startswith("refused_") & (Counter.slot < refused))
    with _connected():
        return Counter.delete().where(old & (Counter.reserved == 0)).execute()
