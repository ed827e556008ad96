"""The cluster page, a node's page, and its live log pane."""
from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user

from ..models import EngineInstall, LogRequest, Model, Node, NodeEvent, Replica, utcnow
from ..services import cards, lifecycle
from ..services.model_views import replica_view
from ..plans.launch import supervisor_for
from ..plans.nodespec import parse_duration
from . import admin_required, is_htmx

bp = Blueprint("cluster", __name__)
REQUEST_PATIENCE_SECONDS = 15


def cluster_view():
    """Return what the cluster page shows: nodes with installs, cards and replicas, and models."""
    nodes = list(Node.select().order_by(Node.name))
    installs = {}
    for row in EngineInstall.select():
        installs.setdefault(row.node_id, []).append(row)
    replicas = {}
    for row in Replica.select(Replica, Model).join(Model).order_by(Replica.name):
        replicas.setdefault(row.node_id, []).append(row)
    rows = cards.fleet_cards(nodes)
    gpus = {n.id: cards.totals(rows[n.id]) for n in nodes}
    models = []
    for m in Model.select().order_by(Model.name):
        mine = [r for rs in replicas.values() for r in rs if r.model_id == m.id]
        verdict = m.verdict or {}
        why = verdict.get("summary", "not placed yet") if verdict.get("placed", 0) < m.replicas else ""
        models.append({"model": m, "ready": sum(r.state == "ready" for r in mine),
                       "placed": len(mine), "why": why})
    every = {"total": sum(g["total"] for g in gpus.values()),
             "healthy": sum(g["healthy"] for g in gpus.values()),
             "free": sum(g["free"] for g in gpus.values()), "by_class": {}}
    for g in gpus.values():
        for cls, (free, total) in g["by_class"].items():
            have = every["by_class"].setdefault(cls, [0, 0])
            have[0] += free
            have[1] += total
    return {"nodes": nodes, "installs": installs, "replicas": replicas, "models": models,
            "gpus": gpus, "all_gpus": every,
            "supervisor": {n.id: supervisor_for(n.facts or {}) for n in nodes}}


@bp.get("/")
@admin_required
def index():
    template = "_cluster.html" if is_htmx() else "cluster.html"
    return render_template(template, **cluster_view())


def _node(name):
    node = Node.get_or_none(Node.name == name)
    if node is None:
        abort(404, f"There is no node called {name!r}.")
    return node


@bp.get("/nodes/<name>")
@admin_required
def node_page(name):
    node = _node(name)
    reps = list(Replica.select().where(Replica.node == node).order_by(Replica.name))
    source = request.args.get("source") or (reps[0].name if reps else "")
    if source and source not in {r.name for r in reps}:
        abort(404, f"{name} runs no replica called {source!r}.")
    events = list(node.events.order_by(NodeEvent.id.desc()).limit(50))
    return render_template("node.html", node=node, replicas=reps, source=source, events=events,
                           **_replicas_view(node, reps),
                           installs=list(node.installs), supervisor=supervisor_for(node.facts or {}),
                           gpus=cards.node_cards(node),
                           lost_after=current_app.config["LLMGW"]["reconciler"]["node_lost_after"])


# Replica states whose rows change by themselves: the node page polls its table meanwhile.
IN_FLUX = ("pending", "fetching", "starting", "moving", "restarting", "draining", "stopping")


def _replicas_view(node, reps):
    views = [replica_view(r) for r in reps]
    return {"views": views, "moving": any(v["state"] in IN_FLUX for v in views)}


@bp.get("/nodes/<name>/replicas")
@admin_required
def node_replicas(name):
    """The node page's replica table, polled while a copy or a start is under way."""
    node = _node(name)
    reps = list(Replica.select().where(Replica.node == node).order_by(Replica.name))
    return render_template("_node_replicas.html", node=node, **_replicas_view(node, reps))


@bp.post("/nodes/<name>/cordon")
@admin_required
def cordon(name):
    flash(lifecycle.cordon(_node(name), True, current_user.email))
    return redirect(url_for("cluster.node_page", name=name))


@bp.post("/nodes/<name>/uncordon")
@admin_required
def uncordon(name):
    flash(lifecycle.cordon(_node(name), False, current_user.email))
    return redirect(url_for("cluster.node_page", name=name))


@bp.post("/nodes/<name>/drain")
@admin_required
def drain(name):
    node = _node(name)
    raw = request.form.get("timeout", "10m")
    try:
        seconds = parse_duration(raw, "timeout")
    except ValueError as e:
        flash(f"{node.name} was not drained: {e}")
    else:
        flash(lifecycle.drain(node, seconds, current_user.email))
    return redirect(url_for("cluster.node_page", name=name))


def _ask(node, source, cursor):
    return LogRequest.create(node=node, source=source, cursor=cursor,
                             lines=100 if not cursor else 1000)


@bp.post("/nodes/<name>/logs")
@admin_required
def log_start(name):
    """Open a log pane: ask the reconciler for a source's last lines; answer with the poller.

    A POST, as is every poll after it: each one writes the reconciler a request, and no GET
    changes anything."""
    node = _node(name)
    source = request.form.get("source", "")
    if not Replica.select().where(Replica.node == node, Replica.name == source).exists():
        abort(404, f"{name} runs no replica called {source!r}.")
    return render_template("_log_lines.html", node=node, lines=[], next_req=_ask(node, source, ""))


@bp.post("/nodes/<name>/logs/<int:req_id>")
@admin_required
def log_poll(name, req_id):
    """Answer a log pane's poll: new lines and the next poller, 204 while the reconciler works."""
    node = _node(name)
    req = LogRequest.get_or_none(LogRequest.id == req_id, LogRequest.node == node)
    if req is None:
        abort(404, "That log request has expired; reload the page.")
    if req.state == "pending":
        waited = (utcnow() - req.created).total_seconds()
        if waited < REQUEST_PATIENCE_SECONDS:
            return "", 204
        return render_template("_log_lines.html", node=node, lines=[], next_req=req,
                               stalled=int(waited))
    nxt = _ask(node, req.source, req.next_cursor or req.cursor)
    req.delete_instance()
    return render_template("_log_lines.html", node=node, lines=req.result or [], next_req=nxt,
                           failed=req.state == "failed")


@bp.app_context_processor
def _helpers():
    return {"log_poll_url": lambda node, req: url_for("cluster.log_poll", name=node.name, req_id=req.id)}
