"""The cluster page, a node's page, and its live log pane."""
from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from ..models import EngineInstall, LogRequest, Model, Node, NodeCommand, NodeEvent, Replica, utcnow
from ..services import cards, lifecycle, logs
from ..services.model_views import replica_view
from ..services.overview import overview
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
    # The cluster's totals (GPUs among them) come from services.overview, passed beside.
    return {"nodes": nodes, "installs": installs, "replicas": replicas, "models": models,
            "gpus": gpus,
            "supervisor": {n.id: supervisor_for(n.facts or {}) for n in nodes}}


@bp.get("/")
@login_required
def index():
    if not current_user.is_admin:
        return redirect(url_for("keys.home"))  # a person's own page, not a "Forbidden"
    template = "_cluster.html" if is_htmx() else "cluster.html"
    return render_template(template, o=overview(current_app.config["LLMGW"]), **cluster_view())


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
                           pane=_pane_options(request.args), line_choices=LINE_CHOICES,
                           commands=_commands(node),
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


LINE_CHOICES = (100, 300, 1000, 2000)
COMMANDS_SHOWN = 100


def _pane_options(values):
    """The log pane's choices from a query string or a poll's form: how many lines it opens
    with, and whether engines' answers to probes (/health, /metrics) are shown."""
    try:
        lines = int(values.get("lines", 300))
    except ValueError:
        lines = 300
    return {"lines": lines if lines in LINE_CHOICES else 300, "probes": values.get("probes") == "1"}


def _shown(lines, pane):
    return lines if pane["probes"] else [line for line in lines if not logs.is_probe(line)]


def _commands(node):
    return list(NodeCommand.select().where(NodeCommand.node == node)
                .order_by(NodeCommand.id.desc()).limit(COMMANDS_SHOWN))


@bp.get("/nodes/<name>/commands")
@admin_required
def node_commands(name):
    """The pane of what the control plane ran on the node, polled."""
    node = _node(name)
    return render_template("_node_commands.html", node=node, commands=_commands(node))


def _ask(node, source, cursor, lines=100):
    return LogRequest.create(node=node, source=source, cursor=cursor,
                             lines=lines if not cursor else 1000)


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
    pane = _pane_options(request.form)
    return render_template("_log_lines.html", node=node, lines=[], pane=pane,
                           next_req=_ask(node, source, "", pane["lines"]))


@bp.post("/nodes/<name>/logs/<int:req_id>")
@admin_required
def log_poll(name, req_id):
    """Answer a log pane's poll: new lines and the next poller, 204 while the reconciler works."""
    node = _node(name)
    pane = _pane_options(request.form)
    req = LogRequest.get_or_none(LogRequest.id == req_id, LogRequest.node == node)
    if req is None:
        abort(404, "That log request has expired; reload the page.")
    if req.state == "pending":
        waited = (utcnow() - req.created).total_seconds()
        if waited < REQUEST_PATIENCE_SECONDS:
            return "", 204
        return render_template("_log_lines.html", node=node, lines=[], next_req=req, pane=pane,
                               stalled=int(waited))
    nxt = _ask(node, req.source, req.next_cursor or req.cursor)
    req.delete_instance()
    lines = req.result or []
    return render_template("_log_lines.html", node=node, lines=lines if req.state == "failed" else _shown(lines, pane),
                           next_req=nxt, pane=pane, failed=req.state == "failed")


@bp.app_context_processor
def _helpers():
    return {"log_poll_url": lambda node, req: url_for("cluster.log_poll", name=node.name, req_id=req.id)}
