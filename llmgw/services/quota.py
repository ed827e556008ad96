"""Admission against rpm, tpm and budgets at every scope, reserved atomically and settled after.

One short transaction per request at admission (none when no limit binds); settling is
batched off the request path (services/settlement.py), and counts what every request used in
every scope whether a limit binds it or not, so a limit set mid-period starts from the truth.
SQLite takes its write lock at BEGIN IMMEDIATE, so every gunicorn worker (and process) sees
the others' reservations; on PostgreSQL the counter rows are locked with SELECT … FOR UPDATE,
and a scope's rpm/tpm window by its "window" row, so two control planes admitting in two
different buckets still check one sum.
"""
import time
import uuid
from dataclasses import dataclass, field

import peewee
from peewee import fn

from ..errors import LlmgwError
from ..models import Counter, LimitRule, Org, Price, Project, Team, database, utcnow
from ..plans import money, quota


class LimitExceeded(LlmgwError):
    """A request would pass a limit; says which, and when to come back."""

    def __init__(self, message, code, retry_after, kind="requests"):
        # kind is OpenAI's error type for what ran out: requests, tokens or insufficient_quota.
        self.code, self.retry_after, self.kind = code, retry_after, kind
        super().__init__(message)


@dataclass
class Reservation:
    key_id: int
    project_id: int
    model: str
    price: tuple
    tokens: int
    cost: int  # micro-units
    prompt_reserved: int = 0  # the prompt's bound, as reserved
    completion_reserved: int = 0  # every choice's cap together, as reserved
    prompt_estimate: int = 0  # billed for a stream cut short before the engine gave its count
    counters: list = field(default_factory=list)  # (lock order, counter id, kind, slot)
    scopes: tuple = ()  # ((scope kind, id), …) from the key up to its org
    admitted: object = None  # when (UTC): the bucket its requests and tokens count in
    started: float = field(default_factory=time.monotonic)
    request_id: str = field(default_factory=lambda: "req_" + uuid.uuid4().hex)


def price_of(model, conf):
    """Return (prompt, completion) micro-units per 1k tokens of a model."""
    row = Price.get_or_none(Price.model == model)
    if row:
        return row.prompt_per_1k, row.completion_per_1k
    p = conf["prices"]
    return p["default_prompt_per_1k_micros"], p["default_completion_per_1k_micros"]


def scopes_of(key):
    """Return [(scope kind, id, name)] from the key up to its org."""
    project = Project.select(Project, Team, Org).join(Team).join(Org).where(
        Project.id == key.project_id).get()
    return [("key", key.id, key.prefix + "…"), ("project", project.id, project.name),
            ("team", project.team.id, project.team.name), ("org", project.team.org.id, project.team.org.name)]


def transaction():
    """A write transaction that takes its locks up front (SQLite) or row by row (PostgreSQL)."""
    if isinstance(database.obj, peewee.SqliteDatabase):
        return database.atomic("IMMEDIATE")
    return database.atomic()


def _counter(kind, scope_kind, scope_id, slot):
    """Return the counter row, created when missing and locked for this transaction."""
    Counter.insert(scope_kind=scope_kind, scope_id=scope_id, kind=kind, slot=slot).on_conflict_ignore().execute()
    query = Counter.select().where(Counter.scope_kind == scope_kind, Counter.scope_id == scope_id,
                                   Counter.kind == kind, Counter.slot == slot)
    if not isinstance(database.obj, peewee.SqliteDatabase):
        query = query.for_update()
    return query.get()


MAX_ENTRIES = 10000
KIND_ORDER = {"rpm": 0, "tpm": 1, "budget": 2, "refused": 3}


class Lookups:
    """A worker's short-lived memory of scopes, rules and prices: the request path reads the
    database for them at most once a second, and a limit that binds nothing costs nothing."""

    def __init__(self, ttl=1.0):
        self.ttl, self.entries = ttl, {}

    def get(self, what, make):
        hit = self.entries.get(what)
        if hit and time.monotonic() - hit[1] < self.ttl:
            return hit[0]
        value = make()
        if len(self.entries) > MAX_ENTRIES:  # a flood of made-up keys must not grow the worker
            self.entries.clear()
        self.entries[what] = (value, time.monotonic())
        return value


def reserve(key, model, body, conf, now=None, lookups=None):
    """Reserve the request's worst case against every scope, or raise LimitExceeded naming one.

    When no limit of any scope binds, nothing is reserved and no transaction is taken.
    """
    now = now or utcnow()
    lookups = lookups or Lookups(ttl=0)
    price = lookups.get(("price", model), lambda: price_of(model, conf))
    prompt, completion = quota.worst_case(body, conf["limits"]["default_max_tokens"])
    money = quota.cost(prompt, completion, price)
    scopes = lookups.get(("scopes", key.id), lambda: scopes_of(key))
    res = Reservation(key.id, scopes[1][1], model, price, prompt + completion, money,
                      prompt_reserved=prompt, completion_reserved=completion,
                      prompt_estimate=min(prompt, quota.estimate_prompt_tokens(body)),
                      scopes=tuple((kind, sid) for kind, sid, _ in scopes), admitted=now)
    limits, binds = lookups.get(("limits", key.id), lambda: _limits_of(scopes, conf))
    if not binds:
        return res
    with transaction():
        plan = []
        for rank, (kind, sid, name) in enumerate(scopes):
            plan += [(rank, sid, *step) for step in _check(kind, sid, name, limits[kind], res, now)]
        for rank, sid, counter, column, amount, what in plan:
            Counter.update({column: getattr(Counter, column) + amount}).where(
                Counter.id == counter.id).execute()
            # The order rows were locked in: settling in the same order cannot deadlock with it.
            res.counters.append(((rank, sid, KIND_ORDER[what]), counter.id, what, counter.slot))
    return res


def _limits_of(scopes, conf):
    """Return ({scope kind: Limit}, whether any of them binds) for a key's scopes."""
    rules = {kind: LimitRule.get_or_none(LimitRule.scope_kind == kind, LimitRule.scope_id == sid)
             for kind, sid, _ in scopes}
    limits = quota.effective(rules, conf["limits"])
    return limits, any(lim.rpm or lim.tpm or lim.budget for lim in limits.values())


def _window(kind, scope_kind, scope_id, now):
    """Lock a scope's rpm or tpm window and return (what its buckets hold, its current bucket)."""
    _counter(kind, scope_kind, scope_id, "window")  # the lock: one sum checked at a time
    first, last = quota.window_slots(now)
    held = (Counter.select(fn.COALESCE(fn.SUM(Counter.used + Counter.reserved), 0))
            .where(Counter.scope_kind == scope_kind, Counter.scope_id == scope_id,
                   Counter.kind == kind, Counter.slot >= first, Counter.slot <= last).scalar())
    return int(held or 0), _counter(kind, scope_kind, scope_id, last)


def _check(kind, sid, name, lim, res, now):
    """Return the increments one scope takes, or raise when it would pass a limit."""
    plan = []
    who = f"{kind} {name!r}"
    if lim.rpm:
        held, c = _window("rpm", kind, sid, now)
        if held + 1 > lim.rpm:
            raise LimitExceeded(f"Rate limit reached for {who}: {lim.rpm} requests per minute "
                                f"({held} in the last {quota.WINDOW_SECONDS} s).",
                                "rate_limit_exceeded", quota.seconds_to_window_room(now), "requests")
        plan.append((c, "used", 1, "rpm"))
    if lim.tpm:
        held, c = _window("tpm", kind, sid, now)
        if held + res.tokens > lim.tpm:
            raise LimitExceeded(f"Token limit reached for {who}: {lim.tpm} tokens per minute "
                                f"({held} used or held in the last {quota.WINDOW_SECONDS} s; this "
                                f"request may use up to {res.tokens}).",
                                "rate_limit_exceeded", quota.seconds_to_window_room(now), "tokens")
        plan.append((c, "reserved", res.tokens, "tpm"))
    if lim.budget:
        c = _counter("budget", kind, sid, quota.budget_slot(lim.period, now))
        if c.used + c.reserved + res.cost > lim.budget:
            wait = quota.seconds_to_reset(lim.period, now)
            raise LimitExceeded(f"Budget exhausted for {who}: {money.show(c.used + c.reserved)} of "
                                f"{money.show(lim.budget)} spent or held per {lim.period}, and this "
                                f"request may cost up to {money.show(res.cost)}.",
                                "insufficient_quota", wait or 3600, "insufficient_quota")
        plan.append((c, "reserved", res.cost, "budget"))
    return plan


def allowed(key, model):
    """Return whether a key may use a model (its allow-list, when it has one)."""
    return not key.models or model in key.models


