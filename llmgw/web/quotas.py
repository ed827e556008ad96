"""The quotas page (limits, prices, what each scope has used) and a usage page per project."""
import datetime

import peewee
from flask import Blueprint, abort, current_app, render_template
from flask_login import current_user, login_required

from ..models import ApiKey, Counter, LimitRule, Membership, Org, Price, Project, Team, Usage, utcnow
from ..plans import quota
from ..services import quota as quota_service
from . import admin_required

bp = Blueprint("quotas", __name__)
SCOPE_NAMES = {"key": (ApiKey, "prefix"), "project": (Project, "name"), "team": (Team, "name"),
               "org": (Org, "name")}


def _name(kind, scope_id):
    model, attr = SCOPE_NAMES[kind]
    row = model.get_or_none(model.id == scope_id)
    return getattr(row, attr, f"#{scope_id}") if row else f"#{scope_id} (gone)"


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
    return render_template("quotas.html", rules=rules, prices=prices, default_price=default_price,
                           defaults=conf["limits"], counters=counters,
                           unpriced=not prices and not any(default_price))


@bp.get("/usage/<project>")
@login_required
def usage(project):
    row = Project.get_or_none(Project.name == project)
    if row is None:
        abort(404, f"There is no project called {project!r}.")
    member = Membership.select().where(Membership.project == row,
                                       Membership.user == int(current_user.id)).exists()
    if not (current_user.is_admin or member):
        abort(403, "Only the project's members and administrators see its usage.")
    since = utcnow() - datetime.timedelta(days=30)
    per_model = list(Usage.select(Usage.model, peewee.fn.COUNT(Usage.id).alias("requests"),
                                  peewee.fn.SUM(Usage.prompt_tokens).alias("prompt"),
                                  peewee.fn.SUM(Usage.completion_tokens).alias("completion"),
                                  peewee.fn.SUM(Usage.cost).alias("cost"))
                     .where(Usage.project_id == row.id, Usage.created >= since)
                     .group_by(Usage.model).dicts())
    # By when each request ended: ids follow the order batches were written in, worker by worker.
    recent = list(Usage.select().where(Usage.project_id == row.id)
                  .order_by(Usage.created.desc()).limit(50))
    refused = quota_service.refusals(row, since)
    return render_template("usage.html", project=row, per_model=per_model, recent=recent,
                           refused=refused)
