"""Write what requests used into the counters and the usage table.

The one place through which both the settling of finished requests and the recovery of a dead
worker's requests go: counter changes are gathered per row and applied in the order admission
locks rows in, so two writers never wait on each other in a circle.
"""
import collections
import contextlib

import peewee

from ..models import Counter, Usage, database
from ..plans import quota

KIND_ORDER = {"rpm": 0, "tpm": 1, "budget": 2, "refused": 3}
SCOPE_RANK = {"key": 0, "project": 1, "team": 2, "org": 3}
USAGE_COLUMNS = ("key_id", "project_id", "model", "prompt_tokens", "completion_tokens", "cost",
                 "latency_ms", "status", "endpoint", "created", "request_id")


def row_key(scope_kind, scope_id, kind, slot):
    """Return a counter row's place in the lock order: scope (key, project, team, org), then
    kind (rpm, tpm, budget), then slot."""
    rank = SCOPE_RANK[scope_kind]
    return ((rank, scope_id, KIND_ORDER[kind.split("_")[0]]), scope_kind, scope_id, kind, slot)


class Changes:
    """Counter changes for one transaction: row key -> [change of reserved, of used, row id]."""

    def __init__(self):
        self.rows = collections.defaultdict(lambda: [0, 0, None])

    def by_id(self, key, counter_id, reserved=0, used=0):
        c = self.rows[key]
        c[0] += reserved
        c[1] += used
        c[2] = counter_id

    def count(self, res, tokens, cost, counted=()):
        """Count a request in its scopes' rpm and tpm buckets and in all four budget periods,
        except in the rows of `counted` (row keys its leased slices settle)."""
        if not res.scopes or res.admitted is None:
            return
        bucket = quota.bucket_slot(res.admitted)
        amounts = [("rpm", bucket, 1), ("tpm", bucket, tokens)]
        amounts += [("budget", slot, cost) for slot in quota.budget_slots(res.admitted).values()]
        for scope_kind, scope_id in res.scopes:
            for kind, slot, amount in amounts:
                key = row_key(scope_kind, scope_id, kind, slot)
                if amount and key not in counted:
                    self.rows[key][1] += amount

    def refused(self, key_id, kind, day, n=1):
        self.rows[row_key("key", key_id, f"refused_{kind}", day)][1] += n

    def apply(self):
        """Apply every change, in lock order, within the caller's transaction."""
        for (_, scope_kind, scope_id, kind, slot), (reserved, used, row) in sorted(self.rows.items()):
            if row is not None:
                if reserved or used:
                    Counter.update(reserved=Counter.reserved + reserved,
                                   used=Counter.used + used).where(Counter.id == row).execute()
            elif used:
                Counter.insert(scope_kind=scope_kind, scope_id=scope_id, kind=kind, slot=slot,
                               used=used).on_conflict(
                    conflict_target=[Counter.scope_kind, Counter.scope_id, Counter.kind, Counter.slot],
                    update={Counter.used: Counter.used + used}).execute()


def usage_row(res, prompt, completion, actual, status, endpoint, latency_ms, ended):
    """Return a usage row's values in USAGE_COLUMNS order."""
    return (res.key_id, res.project_id, res.model, prompt, completion, actual, latency_ms,
            status, endpoint, stamp(ended), res.request_id)


def stamp(when):
    # What peewee stores for a DateTimeField: SQLite keeps text, PostgreSQL a timestamp.
    return str(when) if isinstance(database.obj, peewee.SqliteDatabase) else when


def insert_usage(rows):
    """One prepared INSERT run for every row (peewee would build the SQL text row by row)."""
    if not rows:
        return
    db = database.obj
    marks = ", ".join([db.param] * len(USAGE_COLUMNS))
    sql = f'INSERT INTO "{Usage._meta.table_name}" ({", ".join(USAGE_COLUMNS)}) VALUES ({marks})'
    with peewee.__exception_wrapper__:  # the driver's errors as peewee's, as for other queries
        db.cursor().executemany(sql, rows)


def written(request_ids):
    """Return which of these request ids already have a usage row."""
    ids = list(request_ids)
    if not ids:
        return set()
    return {row.request_id for row in Usage.select(Usage.request_id).where(Usage.request_id.in_(ids))}


@contextlib.contextmanager
def connected():
    """This thread's connection for the block, given back after unless it was open before."""
    opened = database.is_closed()
    if opened:
        database.connect()
    try:
        yield
    finally:
        if opened:
            database.close()


def transaction():
    """A write transaction that takes its locks up front (SQLite) or row by row (PostgreSQL)."""
    if isinstance(database.obj, peewee.SqliteDatabase):
        return database.atomic("IMMEDIATE")
    return database.atomic()
