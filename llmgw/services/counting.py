"""Write what requests used into the counters and the usage table.

The one place through which both the settling of finished requests and the recovery of a dead
worker's requests go: counter changes are gathered per row and applied in the order admission
locks rows in, so two writers never wait on each other in a circle.
"""
import collections
import contextlib
import functools

import peewee

from ..models import Counter, Usage, database
from ..plans import quota

KIND_ORDER = {"rpm": 0, "tpm": 1, "budget": 2, "refused": 3}
SCOPE_RANK = {"key": 0, "project": 1, "team": 2, "org": 3}
ROWS_PER_STATEMENT = 100  # 600 parameters: within SQLite's oldest limit (999)
USAGE_COLUMNS = ("key_id", "project_id", "model", "prompt_tokens", "completion_tokens", "cost",
                 "latency_ms", "status", "endpoint", "created", "request_id")


@functools.lru_cache(maxsize=1 << 14)
def row_key(scope_kind, scope_id, kind, slot):
    """Return a counter row's place in the lock order: scope (key, project, team, org), then
    kind (rpm, tpm, budget), then slot."""
    rank = SCOPE_RANK[scope_kind]
    return ((rank, scope_id, KIND_ORDER[kind.split("_")[0]]), scope_kind, scope_id, kind, slot)


class Changes:
    """Counter changes for one transaction: row key -> [change of reserved, change of used].

    Requests are counted by group first (same scopes, bucket, day and rows left to slices):
    a batch of a thousand requests from one key expands into its rows once."""

    def __init__(self):
        self.rows = collections.defaultdict(lambda: [0, 0])
        self.groups = collections.defaultdict(lambda: [0, 0, 0])  # -> [requests, tokens, cost]

    def add(self, key, reserved=0, used=0):
        c = self.rows[key]
        c[0] += reserved
        c[1] += used

    def count(self, res, tokens, cost, counted=frozenset()):
        """Count a request in its scopes' rpm and tpm buckets and in all four budget periods,
        except in the rows of `counted` (row keys its leased slices settle)."""
        if not res.scopes or res.admitted is None:
            return
        g = self.groups[(res.scopes, quota.bucket_slot(res.admitted), res.admitted.date(), counted)]
        g[0] += 1
        g[1] += tokens
        g[2] += cost

    def _expand(self):
        for (scopes, bucket, day, counted), (requests, tokens, cost) in self.groups.items():
            amounts = [("rpm", bucket, requests), ("tpm", bucket, tokens)]
            amounts += [("budget", slot, cost) for slot in quota.budget_slots(day).values()]
            for scope_kind, scope_id in scopes:
                for kind, slot, amount in amounts:
                    key = row_key(scope_kind, scope_id, kind, slot)
                    if amount and key not in counted:
                        self.rows[key][1] += amount
        self.groups.clear()

    def refused(self, key_id, kind, day, n=1):
        self.rows[row_key("key", key_id, f"refused_{kind}", day)][1] += n

    def empty(self):
        return not self.rows and not self.groups

    def apply(self):
        """Apply every change within the caller's transaction: one upsert per ROWS_PER_STATEMENT
        rows, whose rows are taken in lock order (PostgreSQL locks them in the order of the
        VALUES list). A row that exists (a leased one always does) gets the changes added.

        The SQL is written here, not built by peewee: building it took more CPU than the
        database took to run it (about 1 ms a batch of 24 rows)."""
        self._expand()
        rows = [(scope_kind, scope_id, kind, slot, used, reserved)
                for (_, scope_kind, scope_id, kind, slot), (reserved, used) in sorted(self.rows.items())
                if reserved or used]
        db = database.obj
        for i in range(0, len(rows), ROWS_PER_STATEMENT):
            page = rows[i:i + ROWS_PER_STATEMENT]
            with peewee.__exception_wrapper__:
                db.cursor().execute(_upsert_sql(len(page), db.param), [v for row in page for v in row])


@functools.lru_cache(maxsize=8)
def _upsert_sql(rows, param):
    marks = ", ".join([f"({', '.join([param] * 6)})"] * rows)
    return (f'INSERT INTO "{Counter._meta.table_name}" AS c (scope_kind, scope_id, kind, slot, used, reserved) '
            f"VALUES {marks} ON CONFLICT (scope_kind, scope_id, kind, slot) DO UPDATE SET "
            f"used = c.used + excluded.used, reserved = c.reserved + excluded.reserved")


def usage_row(res, prompt, completion, actual, status, endpoint, latency_ms, ended):
    """Return a usage row's values in USAGE_COLUMNS order."""
    return (res.key_id, res.project_id, res.model, prompt, completion, actual, latency_ms,
            status, endpoint, stamp(ended), res.request_id)


def stamp(when):
    # What peewee stores for a DateTimeField: SQLite keeps text, PostgreSQL a timestamp.
    return str(when) if isinstance(database.obj, peewee.SqliteDatabase) else when


def insert_usage(rows):
    """Insert usage rows with one statement per page: psycopg2's executemany would send one per
    row, and SQLite's runs them in process."""
    if not rows:
        return
    db = database.obj
    table = f'"{Usage._meta.table_name}" ({", ".join(USAGE_COLUMNS)})'
    with peewee.__exception_wrapper__:  # the driver's errors as peewee's, as for other queries
        if isinstance(db, peewee.SqliteDatabase):
            marks = ", ".join([db.param] * len(USAGE_COLUMNS))
            db.cursor().executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        else:
            from psycopg2.extras import execute_values
            execute_values(db.cursor(), f"INSERT INTO {table} VALUES %s", rows, page_size=1000)


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
