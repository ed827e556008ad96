"""Slices of limits leased by a gateway worker, so that admission needs no transaction.

A worker leases a slice of every binding counter (requests and tokens of an rpm/tpm bucket, a
budget period's money) in one transaction: the counter's `reserved` grows by the slice and a
`lease` row records that this worker holds it. It then admits requests from its slices in
memory. A request holds its worst case of each slice while it runs; when it ends, what it
really used is spent, the rest is free again at once. Every settlement batch moves what was
spent from `reserved` to `used` (and out of the lease), and gives back the free part of
slices that are over: budget slices nobody took from for LEASE_SECONDS, rpm/tpm slices when
their bucket ends. So the counter's used + reserved never passes the limit, across
workers and control planes, and at most one slice's worth per worker is held unused.

A slice is larger than one request only while the limit has room for ROOMY such requests
(then it is 1/SHARE of the room left): near a limit's end every request takes exactly its own
worst case, as if each were reserved by itself, so the last requests are admitted exactly.

The worker beats every BEAT_SECONDS with a snapshot of its requests in flight
(services/recovery.py bills those of a worker whose beat stopped, and releases its leases).
"""
import collections
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass

import peewee

from ..db import AWAY, DatabaseAway
from ..models import Counter, GatewayWorker, Lease, database, utcnow
from ..plans import quota as plans
from . import counting
from .quota import LimitExceeded, locked_room, refusal

log = logging.getLogger("llmgw.leases")
BEAT_SECONDS = 1.0
LEASE_SECONDS = 2.0
AHEAD_SECONDS = 1.0
ROOMY = 64
SHARE = 8


class WorkerLost(Exception):
    """This worker's row is gone: another worker found its beat stopped and recovered it."""


@dataclass(eq=False)
class Slice:
    key: tuple  # counting.row_key of its counter row
    counter_id: int
    window: bool  # an rpm/tpm bucket's (usable only within the bucket) or a budget's
    granted: int = 0  # what the lease holds: settled or given back, it leaves this
    held: int = 0  # worst cases of requests running
    spent: int = 0  # used by requests that ended, not yet settled
    until: float = 0.0  # monotonic: a budget slice idle until then goes back
    dead: bool = False  # its lease was released by another worker's recovery
    tight: bool = False  # granted for one request near the limit's end: not shared, given back
    need: object = None  # the Need it was first leased for (to lease the next bucket ahead)
    taken: bool = False  # a request took from it

    @property
    def free(self):
        return self.granted - self.held - self.spent


class Ledger:
    """One worker's slices, identity and requests in flight."""

    def __init__(self, dead_after=30.0):
        self.dead_after = dead_after  # seconds without a beat after which a worker is dead
        self.lock = threading.Lock()  # guards slices and their numbers
        self.growing = threading.Lock()  # one lease transaction at a time per worker
        self.slices = {}  # row key -> Slice
        self.retired = []  # slices replaced by a new lease of their row, until they are empty
        self.inflight = {}  # request id -> (Reservation, callable: completion tokens relayed)
        self.worker = None
        self.pid = None
        self.beating_since = None  # monotonic: beats have succeeded without a gap since

    # Admission ----------------------------------------------------------------------------

    def admit(self, res, needs, now):
        """Hold the request's worst case in a slice of every need, leasing more where a slice
        lacks room; raise LimitExceeded when a limit has no room left for it."""
        for _ in range(3):
            if self._take(res, needs):
                return
            with self.growing:
                if self._take(res, needs):
                    return
                with self.lock:
                    lacking = [n for n in needs if self._free(n) < n.amount]
                # What is leased for this request is taken for it at once: another request of
                # this worker must not take it first and leave this one to lease again.
                if self._lease(lacking, now, res, needs):
                    return
        raise LimitExceeded("This gateway worker's share of a limit was taken by other requests "
                            "three times over while it leased more; try again.",
                            "rate_limit_exceeded", 1)

    def _free(self, need):
        s = self.slices.get(need.key)
        if s is None or s.dead or _expired(s) or (s.tight and s.taken):
            return 0
        return s.free

    def _take(self, res, needs):
        with self.lock:
            return self._take_locked(res, needs)

    def _take_locked(self, res, needs):
        if any(self._free(n) < n.amount for n in needs):
            return False
        now = time.monotonic()
        for n in needs:
            s = self.slices[n.key]
            s.held += n.amount
            s.taken = True
            s.until = now + LEASE_SECONDS
            res.holds.append((s, n.amount, n.kind))
        return True

    def _lease(self, needs, now, res=None, wanted=()):
        """Lease a slice of each need's counter in one transaction; raise LimitExceeded (and
        lease nothing) when one has no room for its request. With res, take its `wanted`
        needs under the same lock as the grants are added; return whether that was done."""
        for _ in range(2):
            granted = []  # what this attempt's transaction grants (nothing if it rolls back)
            try:
                self.ensure_registered()
                with counting.connected(), database.atomic():
                    self.own_row()
                    for n in sorted(needs, key=lambda n: n.key):
                        room, row, held = locked_room(n)
                        if room < n.amount:
                            raise refusal(n, room, held, now)
                        tight = room < ROOMY * n.amount
                        grant = n.amount if tight else max(n.amount, room // SHARE)
                        Counter.update(reserved=Counter.reserved + grant).where(Counter.id == row.id).execute()
                        Lease.insert(worker=self.worker, counter_id=row.id, amount=grant).on_conflict(
                            conflict_target=[Lease.worker, Lease.counter_id],
                            update={Lease.amount: Lease.amount + grant}).execute()
                        granted.append((n, row.id, grant, tight))
                break
            except WorkerLost:
                self.lost()
            except AWAY as e:
                # Fail closed: no limit is checked without the database.
                raise DatabaseAway(str(e).strip()) from e
        with self.lock:
            for n, row_id, grant, tight in granted:
                s = self.slices.get(n.key)
                if s is None or s.dead or _expired(s) or s.tight or tight:
                    if s is not None and not s.dead:
                        self.retired.append(s)  # its free part is on its way back
                    s = self.slices[n.key] = Slice(n.key, row_id, n.window, tight=tight, need=n)
                s.granted += grant
                s.until = time.monotonic() + LEASE_SECONDS
            return res is not None and self._take_locked(res, wanted)

    def lease_ahead(self):
        """Lease the next bucket's slice of every rpm/tpm slice in use, in the last
        AHEAD_SECONDS of its bucket, so that requests do not all wait for a lease transaction
        when the bucket turns. Run by the settlement thread; a refusal is left to requests."""
        now = utcnow()
        left = plans.BUCKET_SECONDS - plans.epoch(now) % plans.BUCKET_SECONDS
        if left > AHEAD_SECONDS:
            return
        bucket = plans.bucket_slot(now)
        upcoming = str(int(bucket) + plans.BUCKET_SECONDS)
        with self.lock:
            needs = []
            for s in self.slices.values():
                if s.window and s.taken and not s.tight and not s.dead and s.key[4] == bucket:
                    n = s.need._replace(slot=upcoming, key=s.key[:4] + (upcoming,))
                    if n.key not in self.slices:
                        needs.append(n)
        if needs:
            with self.growing:
                try:
                    self._lease(needs, now)
                except LimitExceeded:
                    pass

    # Ending and settling --------------------------------------------------------------------

    def finish(self, res, tokens, cost):
        """A request ended having used this much: its holds become what it spent."""
        self.inflight.pop(res.request_id, None)
        if not res.holds:
            return
        with self.lock:
            for s, amount, kind in res.holds:
                s.held -= amount
                s.spent += min(amount, {"rpm": 1, "tpm": tokens, "budget": cost}[kind])

    def take_changes(self, changes):
        """Add to a settlement's Changes what the slices spent, and the free part of those that
        ran out of time; return [(slice, spent, given back)] for after the commit."""
        taken = []
        bucket = plans.bucket_slot(utcnow())
        with self.lock:
            for s in list(self.slices.values()) + self.retired:
                # Nothing is taken from a slice that is over, so its free part cannot change.
                over = (s in self.retired or (s.tight and s.taken)
                        or (s.key[4] < bucket if s.window else _expired(s)))
                back = s.free if over else 0
                if s.spent or back:
                    changes.add(s.key, reserved=-(s.spent + back), used=s.spent)
                    taken.append((s, s.spent, back))
        return taken

    def write_leases(self, taken):
        """Within the settlement's transaction: take what was settled or given back out of
        this worker's lease rows."""
        out = collections.Counter()  # counter id -> what leaves its lease row
        for s, spent, back in taken:
            out[s.counter_id] += spent + back
        if out:
            # One statement, written here: peewee took about 1 ms to build this one each batch.
            db = database.obj
            p = db.param
            table = Lease._meta.table_name
            sql = (f'UPDATE "{table}" SET amount = amount - CASE counter_id '
                   + " ".join([f"WHEN {p} THEN {p}"] * len(out))
                   + f" ELSE 0 END WHERE worker = {p} AND counter_id IN ({', '.join([p] * len(out))})")
            args = [v for item in out.items() for v in item] + [self.worker, *out]
            with peewee.__exception_wrapper__:
                db.cursor().execute(sql, args)
        if any(s.granted <= spent + back for s, spent, back in taken):  # a slice is emptied
            Lease.delete().where(Lease.worker == self.worker, Lease.amount <= 0).execute()

    def settled(self, taken):
        """After the commit: the slices hold that much less."""
        with self.lock:
            for s, spent, back in taken:
                s.spent -= spent
                s.granted -= spent + back
                if not (s.granted or s.held or s.spent):
                    if self.slices.get(s.key) is s:
                        del self.slices[s.key]
                    elif s in self.retired:
                        self.retired.remove(s)

    def idle(self):
        """Whether this worker holds nothing and runs nothing."""
        return not self.slices and not self.retired and not self.inflight

    def give_back_all(self):
        """At exit: every slice is over; what is free of it goes back with the next batch."""
        with self.lock:
            self.retired += [s for s in self.slices.values() if not s.dead]
            self.slices = {}

    # Identity and heartbeat -----------------------------------------------------------------

    def ensure_registered(self):
        if self.worker is not None and self.pid == os.getpid():
            return
        if self.pid is not None and self.pid != os.getpid():
            # A forked child: its parent's slices and requests are not its own.
            self.slices, self.inflight = {}, {}
        worker = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        with counting.connected(), database.atomic():
            GatewayWorker.create(id=worker, host=socket.gethostname(), pid=os.getpid(),
                                 started=utcnow(), beat=utcnow(), inflight=[])
        self.worker, self.pid = worker, os.getpid()

    def own_row(self):
        """First in every transaction that changes this worker's leases: lock its row (the
        order recovery locks rows in); raise WorkerLost when it is gone."""
        if not GatewayWorker.update(beat=utcnow()).where(GatewayWorker.id == self.worker).execute():
            raise WorkerLost(self.worker)

    def lost(self):
        """Another worker released this one's leases and billed its requests from its last
        snapshot: forget the slices (requests holding them settle as unlimited ones, once)."""
        log.error("gateway worker %s was taken for dead (no beat for %g s) and its leases were "
                  "released; it registers again", self.worker, self.dead_after)
        with self.lock:
            for s in list(self.slices.values()) + self.retired:
                s.dead = True
            self.slices, self.retired = {}, []
        self.worker = None
        self.beating_since = None

    def beat(self):
        """Record that this worker lives, with its requests in flight; return whether beats have
        gone on without a gap for long enough to judge other workers dead."""
        self.ensure_registered()
        snapshot = self.snapshot()
        try:
            with counting.connected(), database.atomic():
                self.own_row()
                GatewayWorker.update(inflight=snapshot).where(GatewayWorker.id == self.worker).execute()
        except WorkerLost:
            self.lost()
            return False
        except Exception:
            self.beating_since = None
            raise
        now = time.monotonic()
        if self.beating_since is None:
            self.beating_since = now
        return now - self.beating_since >= self.dead_after

    def snapshot(self):
        """Return what is needed to bill this worker's requests in flight if it dies now."""
        out = []
        for rid, (res, relayed) in list(self.inflight.items()):
            out.append({"id": rid, "key": res.key_id, "project": res.project_id, "model": res.model,
                        "price": list(res.price), "scopes": [list(s) for s in res.scopes],
                        "admitted": res.admitted.isoformat() if res.admitted else None,
                        "prompt": res.prompt_estimate, "prompt_reserved": res.prompt_reserved,
                        "completion": relayed(), "completion_reserved": res.completion_reserved,
                        "endpoint": getattr(res, "endpoint", "")})
        return out

    def deregister(self):
        """At a clean exit with nothing held: remove this worker's row."""
        if self.worker is None or self.pid != os.getpid() or self.inflight:
            return
        with counting.connected(), database.atomic():
            if not Lease.select().where(Lease.worker == self.worker, Lease.amount > 0).exists():
                Lease.delete().where(Lease.worker == self.worker).execute()
                GatewayWorker.delete().where(GatewayWorker.id == self.worker).execute()
                self.worker = None


def _expired(s):
    return not s.window and time.monotonic() > s.until
