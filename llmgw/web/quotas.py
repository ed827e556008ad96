"""The quotas page (limits, prices, what each scope has used) and a usage page per project."""
import csv
import datetime
import io
import urllib.parse

from flask import Blueprint, Response, abort, current_app, render_template, request
from flask_login import current_user, login_required

from ..errors import LlmgwError
from ..models import Counter, LimitRule, Membership, Price, Project, Usage, utcnow
from ..plans import chart, money, quota
from ..services import quota as quota_service
from ..services import limits, usage_history
from . import admin_required

bp = Blueprint("quotas", __name__)


def _name(kind, scope_id):
    model, column = limits.SCOPES[kind]
    row = model.get_or_none(model.id == scope_id)
    return getattr(row, column.name, f"#{scope_id}") if row else f"#{scope_id} (gone)"


@bp.get("/quotas")
@admin_required
def quotas():
    conf = current_app.config["LLMGW"]
    rules = [{"kind": r.scope_kind, "name": _name(r.scope_kind, r.scope_id), "rule": r}
             for r in LimitRule.select().order_by(LimitRule.scope_kind)]
    prices = list(Price.select().order_by(Price.model))
    default_price = (conf["prices"]["default_prompt_per_1k_micros"],
                     conf["prices"]["default_completion_per_1k_micros"])
    # What scopes with a budget spent in the periods their budgets count.
    slots = [(r.scope_kind, r.scope_id, quota.budget_slot(r.period, utcnow()))
             for r in LimitRule.select().where(LimitRule.budget.is_null(False))]
    counters = []
    for kind, sid, slot in slots:
        c = Counter.get_or_none(Counter.scope_kind == kind, Counter.scope_id == sid,
                                Counter.kind == "budget", Counter.slot == slot)
        if c:
            counters.append({"kind": kind, "name": _name(kind, sid), "c": c})
    rule_map = {(r["rule"].scope_kind, r["rule"].scope_id): r["rule"] for r in rules}
    return render_template("quotas.html", rules=rules, prices=prices, default_price=default_price,
                           rule_map=rule_map, spent={}, periods=quota.PERIODS,
                           defaults=conf["limits"], counters=counters,
                           unpriced=not prices and not any(default_price))


def _project_for_me(name):
    row = Project.get_or_none(Project.name == name)
    if row is None:
        abort(404, f"There is no project called {name!r}.")
    member = Membership.select().where(Membership.project == row,
                                       Membership.user == int(current_user.id)).exists()
    if not (current_user.is_admin or member):
        abort(403, "Only the project's members and administrators see its usage.")
    return row


def _history(row):
    """The range the query string asks for, and the rows of it (a bad range: a 400 naming it)."""
    a = request.args
    try:
        begin, end, step = usage_history.parse_range(a.get("from", ""), a.get("to", ""),
                                                     a.get("step", "hour"), utcnow())
    except LlmgwError as e:
        abort(400, f"{e} Example: ?from=2026-11-01&to=2026-11-30&step=day")
    model = a.get("model") or None
    return begin, end, step, model, usage_history.rows(row, begin, end, step, model)


@bp.get("/usage/<project>")
@login_required
def usage(project):
    row = _project_for_me(project)
    begin, end, step, model, found = _history(row)
    charts = [(title, chart.bars(usage_history.series(found, begin, end, step, field), title, unit))
              for field, title, unit in (("requests", "Requests", ""), ("prompt_tokens", "Prompt tokens", ""),
                                         ("completion_tokens", "Completion tokens", ""),
                                         ("errors", "Answers with an error status (4xx, 5xx)", ""))]
    spend = [(label, micros / 1_000_000) for label, micros in usage_history.series(found, begin, end, step, "cost")]
    charts.insert(1, ("Spend", chart.bars(spend, "Spend", "")))
    per_model = {}
    for r in found:
        t = per_model.setdefault(r["model"], dict.fromkeys(usage_history.FIELDS, 0))
        for k in usage_history.FIELDS:
            t[k] += r[k]
    # By when each request ended: ids follow the order batches were written in, worker by worker.
    recent = list(Usage.select().where(Usage.project_id == row.id)
                  .order_by(Usage.created.desc()).limit(50))
    refused = quota_service.refusals(row, begin)
    models = sorted({m for (m,) in Usage.select(Usage.model).where(Usage.project_id == row.id).distinct().tuples()})
    return render_template("usage.html", project=row, per_model=per_model, recent=recent, refused=refused,
                           charts=charts, begin=begin, end=end - datetime.timedelta(days=1), step=step,
                           model=model, models=models)


@bp.get("/usage/<project>.csv")
@login_required
def usage_csv(project):
    """The same range as rows of CSV: one per period and model."""
    row = _project_for_me(project)
    begin, end, step, model, found = _history(row)
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["period", "model", "requests", "prompt_tokens", "completion_tokens", "cost", "errors"])
    for r in found:
        w.writerow([r["period"], r["model"], r["requests"], r["prompt_tokens"], r["completion_tokens"],
                    money.show(r["cost"]), r["errors"]])
    name = f"usage-{row.name}-{begin:%Y%m%d}-{(end - datetime.timedelta(days=1)):%Y%m%d}-{step}.csv"
    # A project's name may be any letters: an ASCII name for old clients, the real one encoded.
    plain = name.encode("ascii", "replace").decode().replace("?", "_")
    return Response(out.getvalue(), mimetype="text/csv", headers={
        "Content-Disposition": f"attachment; filename=\"{plain}\"; filename*=UTF-8''{urllib.parse.quote(name)}"})
