"""A project's usage over a range, per hour or day and per model, summed in the database."""
import datetime

import peewee

from ..errors import LlmgwError
from ..models import Usage, database

STEPS = {"hour": datetime.timedelta(hours=1), "day": datetime.timedelta(days=1)}
MAX_BUCKETS = 800  # a month by the hour, two years by the day
FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cost", "errors")


def parse_range(start, end, step, now):
    """Return (start, end, step) from the query string's text: dates as YYYY-MM-DD (end
    included); by default the last 7 days by the hour. Refuse what cannot be read, by name."""
    if step not in STEPS:
        raise LlmgwError(f"step {step!r} is not one of: hour, day.")
    try:
        end_day = datetime.date.fromisoformat(end) if end else now.date()
        start_day = datetime.date.fromisoformat(start) if start else end_day - datetime.timedelta(days=6)
    except ValueError:
        raise LlmgwError(f"the range {start!r} to {end!r} is not two dates as YYYY-MM-DD.") from None
    if start_day > end_day:
        raise LlmgwError(f"the range starts ({start_day}) after it ends ({end_day}).")
    begin = datetime.datetime.combine(start_day, datetime.time())
    finish = datetime.datetime.combine(end_day + datetime.timedelta(days=1), datetime.time())
    if (finish - begin) / STEPS[step] > MAX_BUCKETS:
        raise LlmgwError(f"{(finish - begin).days} days by the {step} is more than {MAX_BUCKETS} points; "
                         f"choose a shorter range or step=day.")
    return begin, finish, step


def _bucket(step):
    """The SQL expression naming a usage row's hour or day, as text, on either database."""
    if isinstance(database.obj, peewee.PostgresqlDatabase):
        fmt = "YYYY-MM-DD HH24:00" if step == "hour" else "YYYY-MM-DD"
        return peewee.fn.to_char(peewee.fn.date_trunc(step, Usage.created), fmt)
    return peewee.fn.strftime("%Y-%m-%d %H:00" if step == "hour" else "%Y-%m-%d", Usage.created)


def rows(project, begin, end, step, model=None):
    """Return [{period, model, requests, prompt_tokens, completion_tokens, cost, errors}]."""
    bucket = _bucket(step).alias("period")
    query = (Usage.select(bucket, Usage.model, peewee.fn.COUNT(Usage.id).alias("requests"),
                          peewee.fn.SUM(Usage.prompt_tokens).alias("prompt_tokens"),
                          peewee.fn.SUM(Usage.completion_tokens).alias("completion_tokens"),
                          peewee.fn.SUM(Usage.cost).alias("cost"),
                          peewee.fn.SUM(peewee.Case(None, [(Usage.status >= 400, 1)], 0)).alias("errors"))
             .where(Usage.project_id == project.id, Usage.created >= begin, Usage.created < end))
    if model:
        query = query.where(Usage.model == model)
    out = [{k: (int(v or 0) if k in FIELDS else v) for k, v in r.items()}
           for r in query.group_by(peewee.SQL("period"), Usage.model).order_by(peewee.SQL("period"), Usage.model).dicts()]
    return out


def series(found, begin, end, step, field):
    """Return [(period, total of field)] for every period of the range, zero where none."""
    fmt = "%Y-%m-%d %H:00" if step == "hour" else "%Y-%m-%d"
    totals = {}
    for r in found:
        totals[r["period"]] = totals.get(r["period"], 0) + r[field]
    out, at = [], begin
    while at < end:
        label = at.strftime(fmt)
        out.append((label, totals.get(label, 0)))
        at += STEPS[step]
    return out
