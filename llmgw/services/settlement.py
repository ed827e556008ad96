"""Settle finished requests off the request path, many in one transaction.

A response ends by handing its numbers to the worker's Settlement and returning: what it
used is spent from the worker's leased slices at once (services/leases.py). A background
thread (a greenlet under gevent) settles what has gathered every FLUSH_SECONDS: one
transaction moves what the slices spent from reserved to used, gives back slices that are
over, counts every request in every scope and inserts every usage row. Until then what was
spent stays reserved, so a limit can only be stricter for those milliseconds, never looser.
Counter rows are updated in one fixed order (the order in which admission locks them), so two
control planes on PostgreSQL cannot deadlock. The same thread beats for the worker and
recovers dead workers (services/recovery.py).
"""
import atexit
import collections
import datetime
import logging
import os
import threading
import time

import peewee
from peewee import fn

from .. import metrics
from ..models import Counter, database, utcnow
from ..plans import quota
from . import counting, recovery
from .leases import BEAT_SECONDS, Ledger, WorkerLost

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
    """A worker's queue of finished requests and its leased slices, written every
    flush_seconds by a background thread, which also beats for the worker.

    resident: the thread runs for the worker's life (a gunicorn worker, so that dead workers
    are recovered even while no request comes); otherwise it stops after a while idle.
    """

    def __init__(self, flush_seconds=FLUSH_SECONDS, ledger=None, resident=False):
        self.flush_seconds = flush_seconds
        self.ledger = ledger or Ledger()
        self.resident = resident
        self.beaten_at = 0.0
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
        self.measured = collections.deque()  # finished requests the metrics have not counted yet
        atexit.register(self.close)

    def refused(self, key_id, kind, when=None):
        """Count a request turned away with a 429 (rpm, tpm or budget) against its key's day."""
        day = (when or utcnow()).strftime("%Y-%m-%d")
        with self.lock:
            self.refusals[(key_id, kind, day)] += 1
            if not self.closed:
                self._ensure_thread()

    def add(self, res, prompt_tokens, completion_tokens, status, endpoint=""):
        """Queue one finished request; return its real cost. A request is settled once only."""
        if res.settled:
            return 0
        res.settled = True
        # An engine's word is clamped to what the columns hold: one absurd number must not
        # make a batch the database refuses for ever.
        prompt_tokens = max(0, min(int(prompt_tokens), TOKENS_MAX))
        completion_tokens = max(0, min(int(completion_tokens), TOKENS_MAX))
        actual = quota.cost(prompt_tokens, completion_tokens, res.price)
        self.ledger.finish(res, prompt_tokens + completion_tokens, actual)
        item = (res, prompt_tokens, completion_tokens, actual, status, endpoint,
                int((time.monotonic() - res.started) * 1000), utcnow())
        self.measured.append(item)
        with self.lock:
            self.pending.append(item)
            if len(self.pending) > MAX_PENDING:
                # The database has been away a long while. Dropping the oldest loses its usage
                # row; what it used was spent from the slices and is still counted.
                self.pending.popleft()
                self.dropped += 1
                if self.dropped % 1000 == 1:
                    log.error("%d finished requests wait to be settled and the database takes "
                              "none; %d dropped so far", MAX_PENDING, self.dropped)
            if self.closed:
                return actual  # only at exit, after close() settled: written by nobody
            self._ensure_thread()
        return actual

    def start(self):
        with self.lock:
            self._ensure_thread()

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
            if self.flush(once=True) or not self.ledger.idle():
                idle_since = time.monotonic()
            try:
                self.measure()
            except Exception as e:  # the metrics are not worth the thread that settles and beats
                log.warning("counting the metrics failed: %s", e)
            if not self.failing_since:
                try:
                    self.ledger.lease_ahead()
                except Exception as e:  # requests lease for themselves
                    log.warning("leasing the next bucket ahead failed: %s", str(e).strip())
            # A worker beats while it holds or runs anything, and a gunicorn worker always
            # (so that it notices dead workers); a test's or a command's settlement otherwise not.
            if time.monotonic() - self.beaten_at >= BEAT_SECONDS and not self.closed and (
                    self.resident or not self.ledger.idle()):
                self.beaten_at = time.monotonic()
                self._beat()
            if time.monotonic() - self.pruned_at > PRUNE_SECONDS and not self.failing_since:
                self.pruned_at = time.monotonic()
                try:
                    prune()
                except Exception as e:  # the next pass tries again; nothing depends on it
                    log.warning("pruning old counters failed: %s", e)
            elif not self.resident and time.monotonic() - idle_since > IDLE_EXIT_SECONDS:
                with self.lock:
                    if not self.pending and not self.refusals and self.ledger.idle():
                        self.thread = None
                        self._deregister()
                        return

    def measure(self):
        """Count the requests finished since the last call in the metrics (once each, whether
        or not the database has taken them yet), and the requests in flight now."""
        while self.measured:
            res, prompt, completion, actual, status, _, latency_ms, _ = self.measured.popleft()
            metrics.settled(res.model, res.project, status, prompt, completion, actual,
                            latency_ms / 1000,
                            res.first_at - res.started if res.first_at is not None else None)
        metrics.in_flight(len(self.ledger.inflight))

    def _beat(self):
        """Beat for this worker; once its own beats run without a gap, recover dead workers."""
        try:
            if self.ledger.beat():
                recovery.recover_dead(self.ledger.dead_after)
        except Exception as e:  # the database is away: the next beat tries again
            log.warning("the gateway worker's heartbeat failed: %s", str(e).strip())

    def _deregister(self):
        try:
            self.ledger.deregister()
        except Exception as e:
            log.warning("removing the gateway worker's row failed: %s", str(e).strip())

    def close(self):
        """Settle what is left and stop the thread (a worker's exit, the end of a test); waits
        for a batch being written."""
        self.closed = True
        atexit.unregister(self.close)
        thread = self.thread
        if thread is not None and thread is not threading.current_thread() and self.pid == os.getpid():
            thread.join(timeout=max(1.0, self.flush_seconds * 2) if self.flush_seconds < 60 else 0.1)
        self.ledger.give_back_all()
        self.flush()
        self.measure()
        self._deregister()
        if self.pending:
            log.error("%d finished requests could not be settled before exit: their usage rows "
                      "are lost, and this worker's leases are released when other workers find "
                      "its beat stopped", len(self.pending))

    def flush(self, once=False):
        """Settle everything queued now (once: one batch, as the background thread does, so
        that between batches it also beats and leases ahead); return how many requests left
        the queue."""
        done = 0
        with self.writing:
            while not (once and done):
                with self.lock:
                    batch = [self.pending.popleft() for _ in range(min(MAX_BATCH, len(self.pending)))]
                    refused, self.refusals = self.refusals, collections.Counter()
                lost = [item[0].request_id for item in batch
                        if any(s.dead for s, _, _ in item[0].holds)]
                if lost:  # billed by the recovery perhaps: settled only if it was not
                    self.uncertain.update(lost)
                taken = len(batch)
                try:
                    if self.uncertain:
                        batch = self._not_yet_written(batch)
                    if not self._write(batch, refused) and not batch:
                        return done
                except WorkerLost:
                    self.ledger.lost()
                    with self.lock:
                        self.refusals.update(refused)
                        self.pending.extendleft(reversed(batch))
                    continue
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
        with counting.connected():
            written = counting.written(ids)
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
                self._write([item])
            except REFUSED:
                res = item[0]
                log.exception("the database refuses to settle one request (key %s, model %r, "
                              "%s prompt and %s completion tokens); its usage row is lost (what "
                              "its limits counted of it stays counted)",
                              res.key_id, res.model, item[1], item[2])
            except Exception as e:
                self._failing(e, len(batch) - i, batch[i:])
                return batch[i:]
        return []

    def _write(self, batch, refused=()):
        """Settle a batch in one transaction: what the slices spent moves from reserved to used
        and out of the worker's leases (with the free part of slices that are over), every
        request is counted in the rows no slice of its counts it in, usage rows go in. Return
        whether anything was written.

        refused: Counter of (key id, OpenAI error type, day) -> requests turned away with a 429.
        """
        changes = counting.Changes()
        taken = self.ledger.take_changes(changes)
        rows = []
        for res, prompt, completion, actual, status, endpoint, latency, ended in batch:
            counted = frozenset(s.key for s, _, _ in res.holds if not s.dead)
            changes.count(res, prompt + completion, actual, counted)
            rows.append(counting.usage_row(res, prompt, completion, actual, status, endpoint,
                                           latency, ended))
        for (key_id, kind, day), n in refused.items() if refused else ():
            changes.refused(key_id, kind, day, n)
        if not rows and changes.empty():
            return False
        with counting.connected(), database.atomic():
            if taken:
                self.ledger.own_row()  # first: the order recovery locks rows in
            changes.apply()
            self.ledger.write_leases(taken)
            counting.insert_usage(rows)
        self.ledger.settled(taken)
        return True

    def _failing(self, error, count, batch=()):
        self.uncertain.update(item[0].request_id for item in batch)
        if self.failing_since is None:
            self.failing_since = time.monotonic()
            log.error("settling %d requests failed (%s); their reservations stay held and they "
                      "are tried again until the database takes them", count, str(error).strip())


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
    with counting.connected():
        return Counter.delete().where(old & (Counter.reserved == 0)).execute()
