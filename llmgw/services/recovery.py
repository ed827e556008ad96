"""Recover a gateway worker whose heartbeat stopped: release its leases, bill its requests.

A worker killed outright (SIGKILL, the OOM killer, a machine gone) leaves its lease rows and
its last snapshot of requests in flight. The first other worker that has itself beaten without
a gap for the dead-after time, and so cannot mistake its own outage for others' deaths, takes
the dead worker's row in a transaction: every counter gives back what the dead worker's leases
held, and each request of the snapshot is billed for what it had relayed by then (its prompt's
estimate and the completion tokens relayed, never past its reservation), with status 502,
unless it was settled already. Then the lease rows and the worker's row go.
"""
import datetime
import logging

import peewee

from ..models import Counter, GatewayWorker, Lease, database, utcnow
from ..plans import money
from . import counting
from .quota import Reservation

log = logging.getLogger("llmgw.recovery")
LOST_STATUS = 502  # what the client of a request whose worker died saw: a broken connection


def recover_dead(dead_after):
    """Recover every worker whose last beat is older than dead_after seconds; return how many."""
    cutoff = utcnow() - datetime.timedelta(seconds=dead_after)
    with counting.connected():
        ids = [w.id for w in GatewayWorker.select(GatewayWorker.id).where(GatewayWorker.beat < cutoff)]
    return sum(recover(worker_id, cutoff) for worker_id in ids)


def recover(worker_id, cutoff):
    """Recover one worker if its beat is still older than cutoff; return 1 if it was."""
    with counting.connected(), database.atomic():
        query = GatewayWorker.select().where(GatewayWorker.id == worker_id, GatewayWorker.beat < cutoff)
        if not isinstance(database.obj, peewee.SqliteDatabase):
            query = query.for_update()  # after a live worker's own lock, its beat is fresh again
        row = query.get_or_none()
        if row is None:
            return 0
        changes = counting.Changes()
        held = {lease.counter_id: lease.amount
                for lease in Lease.select().where(Lease.worker == worker_id, Lease.amount != 0)}
        for c in Counter.select().where(Counter.id.in_(list(held))):
            changes.add(counting.row_key(c.scope_kind, c.scope_id, c.kind, c.slot), reserved=-held[c.id])
        entries = list(row.inflight or [])
        done = counting.written(e["id"] for e in entries)
        rows = []
        for e in entries:
            if e["id"] in done:
                continue
            res, prompt, completion = _billed(e)
            cost = money.cost(prompt, completion, res.price)
            changes.count(res, prompt + completion, cost)
            latency = int((utcnow() - res.admitted).total_seconds() * 1000) if res.admitted else 0
            rows.append(counting.usage_row(res, prompt, completion, cost, LOST_STATUS,
                                           e.get("endpoint") or "", latency, utcnow()))
        changes.apply()
        counting.insert_usage(rows)
        Lease.delete().where(Lease.worker == worker_id).execute()
        GatewayWorker.delete().where(GatewayWorker.id == worker_id).execute()
    log.warning("gateway worker %s (pid %s on %s) stopped beating at %s: released %d leases and "
                "billed %d requests it had in flight", worker_id, row.pid, row.host, row.beat, len(held),
                len(rows))
    return 1


def _billed(entry):
    """Return (Reservation, prompt tokens, completion tokens) to bill for a snapshot entry."""
    admitted = entry.get("admitted")
    res = Reservation(entry["key"], entry["project"], entry["model"], tuple(entry["price"]), 0, 0,
                      scopes=tuple(tuple(s) for s in entry.get("scopes") or ()),
                      admitted=datetime.datetime.fromisoformat(admitted) if admitted else None,
                      request_id=entry["id"])
    prompt, completion = int(entry.get("prompt") or 0), int(entry.get("completion") or 0)
    if entry.get("prompt_reserved"):
        prompt = min(prompt, int(entry["prompt_reserved"]))
    if entry.get("completion_reserved"):
        completion = min(completion, int(entry["completion_reserved"]))
    return res, prompt, completion
