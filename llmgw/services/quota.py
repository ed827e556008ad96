"""Admission against rpm, tpm and budgets at every scope, from slices leased per worker.

What a request could use at most (its worst case) is checked against every limit that binds
it, at its key, project, team and org. A worker admits from slices of each binding counter
that it leased in one transaction (services/leases.py): most requests take no transaction at
all, and none when no limit binds. Settling (services/settlement.py) counts what every
request used in every scope, limited or not, so a limit set mid-period starts from the truth.
"""
import time
import uuid
from dataclasses import dataclass, field
from typing import NamedTuple

import peewee
from peewee import fn

from ..db import cached
from ..errors import LlmgwError
from ..models import ApiKey, Counter, LimitRule, Org, Price, Project, Team, database, utcnow
from ..plans import money, quota
from .counting import row_key


class LimitExceeded(LlmgwError):
    """A request would pass a limit; says which, and when to come back."""

    def __init__(self, message, code, retry_after, kind="requests", scope="worker"):
        # kind is OpenAI's error type for what ran out: requests, tokens or insufficient_quota;
        # scope the kind of scope whose limit it is (key, project, team, org), or "worker" when
        # the worker's share was taken while it leased more.
        self.code, self.retry_after, self.kind, self.scope = code, retry_after, kind, scope
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
    holds: list = field(default_factory=list)  # (slice, amount, kind): what it holds of leased slices
    scopes: tuple = ()  # ((scope kind, id), …) from the key up to its org
    admitted: object = None  # when (UTC): the bucket its requests and tokens count in
    endpoint: str = ""  # the replica it was sent to, once sent
    settled: bool = False  # handed to the settlement (once only)
    started: float = field(default_factory=time.monotonic)
    first_at: float = None  # when a stream's first bytes came from the engine
    project: str = ""  # the project's name, for the metrics
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


def _counter(kind, scope_kind, scope_id, slot):
    """Return the counter row, created when missing and locked for this transaction."""
    Counter.insert(scope_kind=scope_kind, scope_id=scope_id, kind=kind, slot=slot).on_conflict_ignore().execute()
    query = Counter.select().where(Counter.scope_kind == scope_kind, Counter.scope_id == scope_id,
                                   Counter.kind == kind, Counter.slot == slot)
    if not isinstance(database.obj, peewee.SqliteDatabase):
        query = query.for_update()
    return query.get()


def locked_room(need):
    """Lock a need's counter (an rpm/tpm window through its "window" row first) and return
    (room left under the limit, the row a grant goes to, what is held of it unsettled)."""
    if need.kind == "budget":
        c = _counter("budget", need.scope_kind, need.scope_id, need.slot)
        return need.limit - c.used - c.reserved, c, c.reserved
    _counter(need.kind, need.scope_kind, need.scope_id, "window")  # one sum checked at a time
    first, _ = quota.window_slots_of(need.slot)
    # Every bucket from the window's first on, later ones included: a request that waited for
    # this lock past its bucket's end must count what newer buckets admitted meanwhile.
    used, reserved = (Counter.select(fn.COALESCE(fn.SUM(Counter.used), 0),
                                     fn.COALESCE(fn.SUM(Counter.reserved), 0))
                      .where(Counter.scope_kind == need.scope_kind, Counter.scope_id == need.scope_id,
                             Counter.kind == need.kind, Counter.slot >= first,
                             Counter.slot != "window")
                      .tuples().get())
    return need.limit - int(used) - int(reserved), _counter(need.kind, need.scope_kind, need.scope_id,
                                                            need.slot), int(reserved)


MAX_ENTRIES = 10000


class Lookups:
    """A worker's short-lived memory of scopes, rules and prices: the request path reads the
    database for them at most once a second, and a limit that binds nothing costs nothing."""

    def __init__(self, ttl=1.0):
        self.ttl, self.entries, self.reading = ttl, {}, {}

    def get(self, what, make):
        if len(self.entries) > MAX_ENTRIES:  # a flood of made-up keys must not grow the worker
            self.entries.clear()
        return cached(self.entries, self.reading, what, self.ttl, make)


class Need(NamedTuple):
    """What a request takes of one binding limit: `amount` of counter row `key`. (A tuple: a
    few are made for every limited request.)"""

    key: tuple  # counting.row_key: the lock order
    scope_kind: str
    scope_id: int
    name: str
    kind: str  # rpm, tpm or budget
    slot: str  # the bucket (rpm, tpm) or the budget period's slot
    amount: int
    limit: int
    period: str = ""

    @property
    def window(self):
        return self.kind != "budget"


def reserve(key, model, body, conf, ledger, now=None, lookups=None):
    """Admit a request against every limit that binds it, holding its worst case in this
    worker's leased slices; raise LimitExceeded naming a limit it would pass.

    When no limit of any scope binds, nothing is held and nothing is asked of the database.
    """
    now = now or utcnow()
    lookups = lookups or Lookups(ttl=0)
    price = lookups.get(("price", model), lambda: price_of(model, conf))
    prompt, completion = quota.worst_case(body, conf["limits"]["default_max_tokens"])
    worst_cost = quota.cost(prompt, completion, price)
    scopes = lookups.get(("scopes", key.id), lambda: scopes_of(key))
    res = Reservation(key.id, scopes[1][1], model, price, prompt + completion, worst_cost,
                      prompt_reserved=prompt, completion_reserved=completion,
                      prompt_estimate=min(prompt, quota.estimate_prompt_tokens(body)),
                      scopes=tuple((kind, sid) for kind, sid, _ in scopes), admitted=now,
                      project=scopes[1][2])
    limits, binds, memo = lookups.get(("limits", key.id), lambda: _limits_of(scopes, conf))
    if binds:
        ledger.admit(res, needs_of(scopes, limits, res, now, memo), now)
    return res


def needs_of(scopes, limits, res, now, memo=None):
    """Return the Needs of a request: one per limit that binds it, in lock order.

    memo: a dict that lives as long as `limits` do, where the rows of a bucket and day are
    kept: requests of a key in one bucket differ only by their amounts."""
    bucket = quota.bucket_slot(now)
    at = (bucket, now.date())
    rows = memo.get(at) if memo is not None else None
    if rows is None:
        rows = []
        for kind, sid, name in scopes:
            lim = limits[kind]
            for what, limit in (("rpm", lim.rpm), ("tpm", lim.tpm), ("budget", lim.budget)):
                if limit:
                    slot = bucket if what != "budget" else quota.budget_slot(lim.period, now)
                    rows.append((row_key(kind, sid, what, slot), kind, sid, name, what, slot, limit,
                                 lim.period))
        if memo is not None:
            if len(memo) > 3:  # buckets that are over
                memo.clear()
            memo[at] = rows
    amounts = {"rpm": 1, "tpm": res.tokens, "budget": res.cost}
    return [Need(k, sk, sid, name, what, slot, amounts[what], limit, period)
            for k, sk, sid, name, what, slot, limit, period in rows]


def refusal(need, room, held, now):
    """Return the LimitExceeded for a need that does not fit in the room a limit has left."""
    who = f"{need.scope_kind} {need.name!r}"
    if need.kind == "rpm":
        return LimitExceeded(f"Rate limit reached for {who}: {need.limit} requests per minute "
                             f"({need.limit - room} made, in flight or leased to gateway workers in "
                             f"the last {quota.WINDOW_SECONDS} s).", "rate_limit_exceeded",
                             quota.seconds_to_window_room(now), "requests", need.scope_kind)
    if need.kind == "tpm":
        return LimitExceeded(f"Token limit reached for {who}: {need.limit} tokens per minute "
                             f"({need.limit - room} used or held in the last {quota.WINDOW_SECONDS} s; "
                             f"this request may use up to {need.amount}).", "rate_limit_exceeded",
                             quota.seconds_to_window_room(now), "tokens", need.scope_kind)
    wait = quota.seconds_to_reset(need.period, now) or 3600
    if held >= need.amount:
        wait = min(wait, 2)  # what requests in flight hold comes back as they end
    return LimitExceeded(f"Budget exhausted for {who}: {money.show(need.limit - room)} of "
                         f"{money.show(need.limit)} spent or held per {need.period}, and this "
                         f"request may cost up to {money.show(need.amount)}.",
                         "insufficient_quota", wait, "insufficient_quota", need.scope_kind)


def _limits_of(scopes, conf):
    """Return ({scope kind: Limit}, whether any of them binds, a memo for needs_of) for a key's
    scopes."""
    rules = {kind: LimitRule.get_or_none(LimitRule.scope_kind == kind, LimitRule.scope_id == sid)
             for kind, sid, _ in scopes}
    limits = quota.effective(rules, conf["limits"])
    return limits, any(lim.rpm or lim.tpm or lim.budget for lim in limits.values()), {}


def refusals(project, since):
    """Return [{day, key, type, requests}] turned away with a 429, per key of a project and day."""
    keys = {k.id: k.prefix + "…" for k in ApiKey.select().where(ApiKey.project == project)}
    if not keys:
        return []
    rows = (Counter.select().where(Counter.scope_kind == "key", Counter.scope_id.in_(list(keys)),
                                   Counter.kind.startswith("refused_"),
                                   Counter.slot >= since.strftime("%Y-%m-%d"))
            .order_by(Counter.slot, Counter.scope_id, Counter.kind))
    return [{"day": c.slot, "key": keys[c.scope_id], "type": c.kind[len("refused_"):],
             "requests": c.used} for c in rows]


def allowed(key, model):
    """Return whether a key may use a model (its allow-list, when it has one)."""
    return not key.models or model in key.models


