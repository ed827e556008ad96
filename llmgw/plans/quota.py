"""Limits and money, pure: which limits bind a request, its worst case, and the windows it counts in.

rpm and tpm count in a sliding window of BUCKET_SECONDS buckets: a request is admitted only
when the buckets of the last WINDOW_SECONDS, its own bucket included, hold room for it. Any 60
seconds lie within such a window, so no 60 seconds ever see more than the limit, across a
minute's boundary too (a fixed per-minute counter lets twice the limit through there).
"""
import datetime
import functools
import json
import math
from dataclasses import dataclass

from . import money

SCOPES = ("key", "project", "team", "org")
PERIODS = ("day", "week", "month", "never")


@dataclass(frozen=True)
class Limits:
    rpm: int = 0
    tpm: int = 0
    budget: int = 0  # micro-units
    period: str = "month"


BUCKET_SECONDS = 5
WINDOW_BUCKETS = 13  # this bucket and the twelve before it: 65 s, which covers any 60 s
WINDOW_SECONDS = BUCKET_SECONDS * WINDOW_BUCKETS


def effective(rules, defaults):
    """Return {scope_kind: Limits} from the rules set on each scope of a request.

    rules: {scope_kind: LimitRule-like or None}. A limit set on no scope at all takes the
    configured default, applied at the project: without defaults a new project is metered by
    nothing, and a budget that exists nowhere never binds.
    """
    out = {kind: Limits(rpm=getattr(r, "rpm", None) or 0, tpm=getattr(r, "tpm", None) or 0,
                        budget=getattr(r, "budget", None) or 0,
                        period=getattr(r, "period", None) or "month")
           for kind, r in rules.items()}
    project = out.get("project", Limits())
    fill = {}
    for field in ("rpm", "tpm", "budget"):
        if not any(getattr(rules.get(k), field, None) for k in rules):
            fill[field] = defaults[f"default_{field}"] if field != "budget" else \
                defaults.get("default_budget_micros", 0)
    if "budget" in fill and not any(getattr(rules.get(k), "budget", None) for k in rules):
        fill["period"] = defaults["default_period"]
    out["project"] = Limits(**{**project.__dict__, **fill})
    return out


def epoch(now):
    """Return a naive UTC datetime as seconds since 1970."""
    return (now - datetime.datetime(1970, 1, 1)).total_seconds()


def bucket_slot(now):
    """Return the slot of the rpm/tpm bucket a moment counts in: its start, in epoch seconds."""
    return str(int(epoch(now)) // BUCKET_SECONDS * BUCKET_SECONDS)


def window_slots(now):
    """Return (first, last) bucket slots of the window a request admitted now is checked
    against; slots are ten-digit numbers, so they compare as text too."""
    return window_slots_of(bucket_slot(now))


def window_slots_of(last):
    """Return (first, last) bucket slots of the window that ends with bucket `last`."""
    return str(int(last) - BUCKET_SECONDS * (WINDOW_BUCKETS - 1)), last


def seconds_to_window_room(now):
    """Return when the oldest bucket of the window leaves it: the earliest a full window can
    take another request."""
    return max(1, BUCKET_SECONDS - int(epoch(now)) % BUCKET_SECONDS)



def budget_slot(period, now):
    """Return the slot a budget counts in: the day, ISO week or month it resets with, or 'all'."""
    return budget_slots(now)[period] if period in PERIODS else "all"


def budget_slots(now):
    """Return {period: slot} of every budget period at a moment: spend is counted in all of
    them, so a budget set in the middle of one finds what was spent before it. (`now` may be
    a date.)"""
    return _slots_of_day(now.date() if isinstance(now, datetime.datetime) else now)


@functools.lru_cache(maxsize=64)
def _slots_of_day(day):
    # Every admitted request asks for these (strftime is most of a settled request's cost
    # otherwise); they change once a day. The dict is shared: callers only read it.
    year, week, _ = day.isocalendar()
    slots = {"day": day.strftime("%Y-%m-%d"), "week": f"{year}-W{week:02d}",
             "month": day.strftime("%Y-%m")}
    return {period: slots.get(period, "all") for period in PERIODS}


def period_start(period, now):
    """Return when the budget period holding a moment began (None: 'never' has no start)."""
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    if period == "day":
        return day
    if period == "week":
        return day - datetime.timedelta(days=now.weekday())
    if period == "month":
        return day.replace(day=1)
    return None


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
    """Return the cost in micro-units; price = (prompt, completion) micro-units per 1k tokens."""
    return money.cost(prompt_tokens, completion_tokens, price)


def estimate_prompt_tokens(body):
    """Return a likely count of a request's prompt tokens (about 3 characters a token).

    What is billed for a stream cut short before the engine said its count; never what is
    reserved, which is prompt_bound().
    """
    text = _prompt_text(body)
    overhead = 4 * len(body.get("messages") or []) if "messages" in body else 0
    return math.ceil(len(text) / 3) + overhead + 1


# A chat template wraps each message in a few tokens of its own (role markers, separators),
# and the whole in a few more; these bound what common templates add.
TEMPLATE_PER_MESSAGE, TEMPLATE_FIXED = 16, 32


def prompt_bound(body):
    """Return a count of prompt tokens no tokenizer can exceed: one token per UTF-8 byte of
    every text the engine reads (messages, tools, the prompt, the input), one per given token
    id, plus the chat template's own.

    A byte-level tokenizer never spends more than one token on a byte, so this holds for CJK,
    emoji and code, which a characters-per-token guess under-counts several times over.
    """
    if "messages" in body:
        messages = body.get("messages") or []
        extra = [body.get(k) for k in ("tools", "functions", "response_format") if body.get(k)]
        return (sum(_message_bytes(m) for m in messages) + sum(_bytes(e) for e in extra)
                + TEMPLATE_PER_MESSAGE * len(messages) + TEMPLATE_FIXED)
    source = body.get("prompt", body.get("input", ""))
    return _tokens_in(source) + 1


def _tokens_in(value):
    """Bound the tokens of a prompt or input: a string, a list of strings, token ids, or lists
    of token ids (each id is one token)."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bool) or value is None:
        return 1
    if isinstance(value, int):
        return 1
    if isinstance(value, list):
        return sum(_tokens_in(v) for v in value) + len(value)
    return _bytes(value)


def _message_bytes(m):
    """Bytes of one chat message: its text alone when it is only that (the common case, and
    the cheap one), else the whole message as JSON (parts, tool calls, images' URLs)."""
    if isinstance(m, dict) and isinstance(m.get("content"), str) and len(m) <= 2:
        return len(m["content"].encode("utf-8")) + len(str(m.get("role", "")))
    return _bytes(m)


def _bytes(value):
    """Bytes of a message or other JSON value as the engine's template would read its text."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    return len(json.dumps(value, ensure_ascii=False).encode("utf-8"))


def _prompt_text(body):
    if "messages" in body:
        return "".join(str(m.get("content", "")) if isinstance(m, dict) else str(m)
                       for m in body.get("messages") or [])
    return str(body.get("prompt", body.get("input", "")))


def completion_cap(body, default_max_tokens):
    """Return the tokens one choice may generate: what the request asks, else the default cap
    (which the gateway then sends to the engine, so that it holds)."""
    asked = body.get("max_completion_tokens", body.get("max_tokens"))
    return asked if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0 \
        else default_max_tokens


def choices(body):
    """Return how many completions a request generates: n, or best_of when it is larger."""
    counts = [v for v in (body.get("n"), body.get("best_of"))
              if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return max(counts, default=1)


def worst_case(body, default_max_tokens):
    """Return (prompt tokens, completion tokens) a request could use at most."""
    if body.get("input") is not None and "messages" not in body and "prompt" not in body:
        return prompt_bound(body), 0  # embeddings generate nothing
    return prompt_bound(body), completion_cap(body, default_max_tokens) * choices(body)
