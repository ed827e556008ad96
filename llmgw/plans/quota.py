"""Limits and money, pure: which limits bind a request, its worst case, and the windows it counts in."""
import datetime
import math
from dataclasses import dataclass

SCOPES = ("key", "project", "team", "org")
PERIODS = ("day", "week", "month", "never")


@dataclass(frozen=True)
class Limits:
    rpm: int = 0
    tpm: int = 0
    budget: float = 0.0
    period: str = "month"


@dataclass(frozen=True)
class Need:
    """What one request asks for against one scope, and in which slots it counts."""

    scope_kind: str
    scope_id: int
    limits: Limits
    minute: str
    budget_slot: str


def effective(rules, defaults):
    """Return {scope_kind: Limits} from the rules set on each scope of a request.

    rules: {scope_kind: LimitRule-like or None}. A limit set on no scope at all takes the
    configured default, applied at the project: without defaults a new project is metered by
    nothing, and a budget that exists nowhere never binds.
    """
    out = {kind: Limits(rpm=getattr(r, "rpm", None) or 0, tpm=getattr(r, "tpm", None) or 0,
                        budget=getattr(r, "budget", None) or 0.0,
                        period=getattr(r, "period", None) or "month")
           for kind, r in rules.items()}
    project = out.get("project", Limits())
    fill = {}
    for field in ("rpm", "tpm", "budget"):
        if not any(getattr(rules.get(k), field, None) for k in rules):
            fill[field] = defaults[f"default_{field}"]
    if "budget" in fill and not any(getattr(rules.get(k), "budget", None) for k in rules):
        fill["period"] = defaults["default_period"]
    out["project"] = Limits(**{**project.__dict__, **fill})
    return out


def minute_slot(now):
    return now.strftime("%Y-%m-%dT%H:%M")


def budget_slot(period, now):
    """Return the slot a budget counts in: the day, ISO week or month it resets with, or 'all'."""
    if period == "day":
        return now.strftime("%Y-%m-%d")
    if period == "week":
        year, week, _ = now.isocalendar()
        return f"{year}-W{week:02d}"
    if period == "month":
        return now.strftime("%Y-%m")
    return "all"


def seconds_to_next_minute(now):
    return max(1, 60 - now.second)


def seconds_to_reset(period, now):
    """Return how long until a budget of this period starts again (None: never)."""
    if period == "day":
        nxt = (now + datetime.timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    elif period == "week":
        nxt = (now + datetime.timedelta(days=7 - now.weekday())).replace(
            hour=0, minute=0, second=0, microsecond=0)
    elif period == "month":
        nxt = (now.replace(day=28) + datetime.timedelta(days=4)).replace(
            day=1, hour=0, minute=0, second=0, microsecond=0)
    else:
        return None
    return max(1, int((nxt - now).total_seconds()))


def cost(prompt_tokens, completion_tokens, price):
    """Return the cost in the price's currency; price = (prompt per 1k, completion per 1k)."""
    return prompt_tokens / 1000 * price[0] + completion_tokens / 1000 * price[1]


def estimate_prompt_tokens(body):
    """Return a generous estimate of a request's prompt tokens (about 3 characters a token)."""
    if "messages" in body:
        text = "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m)
                       for m in body.get("messages") or [])
        overhead = 4 * len(body.get("messages") or [])
    else:
        text = str(body.get("prompt", body.get("input", "")))
        overhead = 0
    return math.ceil(len(text) / 3) + overhead + 1


def worst_case(body, default_max_tokens):
    """Return (prompt tokens, completion tokens) a request could use at most."""
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    completion = asked if isinstance(asked, int) and asked > 0 else default_max_tokens
    if body.get("input") is not None and "messages" not in body and "prompt" not in body:
        completion = 0  # embeddings generate nothing
    return estimate_prompt_tokens(body), completion
