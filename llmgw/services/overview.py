"""The cluster on one screen: totals and what needs an operator, for `status` and the cluster
page. Every warning says what to do about it."""
import collections
import datetime

from ..models import Endpoint, EngineInstall, Model, Node, Replica, Usage, utcnow
from . import cards

RATE_SECONDS = 60  # "requests per second now": the usage rows of the last minute
TROUBLED_REPLICAS = ("failed", "unhealthy")


def node_state(node):
    """One word for a node: lost, unreachable (its last look failed), else what an operator set
    (ready, cordoned, draining, drained)."""
    if node.lost_since is not None:
        return "lost"
    if not node.reachable:
        return "unreachable"
    return node.state


def overview(conf, now=None):
    now = now or utcnow()
    nodes = list(Node.select().order_by(Node.name))
    states = collections.Counter(node_state(n) for n in nodes)
    rows = cards.fleet_cards(nodes)
    gpus = {"total": 0, "healthy": 0, "free": 0, "by_class": {}}
    for n in nodes:
        t = cards.totals(rows[n.id])
        for k in ("total", "healthy", "free"):
            gpus[k] += t[k]
        for cls, (free, total) in t["by_class"].items():
            have = gpus["by_class"].setdefault(cls, [0, 0])
            have[0] += free
            have[1] += total
    replicas = list(Replica.select(Replica, Model, Node).join(Model).switch(Replica).join(Node)
                    .order_by(Replica.name))
    by_state = collections.Counter(r.state for r in replicas)
    models = []
    for m in Model.select().order_by(Model.name):
        mine = [r for r in replicas if r.model_id == m.id]
        ready = sum(r.state == "ready" for r in mine)
        why = "" if ready >= m.replicas else (m.verdict or {}).get("summary", "not placed yet")
        models.append({"name": m.name, "engine": m.engine, "wanted": m.replicas, "ready": ready, "why": why})
    since = now - datetime.timedelta(seconds=RATE_SECONDS)
    recent = Usage.select().where(Usage.created > since).count()
    endpoints = [{"name": e.name, "state": e.state, "detail": e.detail}
                 for e in Endpoint.select().order_by(Endpoint.name)]
    return {
        "nodes": {"total": len(nodes), "by_state": dict(sorted(states.items()))},
        "gpus": {**gpus, "by_class": {c: {"free": f, "total": t} for c, (f, t) in sorted(gpus["by_class"].items())}},
        "replicas": {"total": len(replicas), "ready": by_state.get("ready", 0),
                     "by_state": dict(sorted(by_state.items()))},
        "models": models,
        "endpoints": endpoints,
        "requests_per_second": round(recent / RATE_SECONDS, 2),
        "warnings": warnings(conf, nodes, replicas, models, endpoints),
    }


def warnings(conf, nodes, replicas, models, endpoints):
    """Sentences for what is stuck or broken, each with what to do."""
    out = []
    for n in nodes:
        if n.lost_since is not None:
            out.append(f"node {n.name} is lost since {n.lost_since:%Y-%m-%d %H:%M} UTC ({n.last_error or 'no answer'}); "
                       f"its replicas were moved. Bring it back, or forget it with `llmgw remove-node {n.name} --force`.")
        elif not n.reachable:
            out.append(f"node {n.name} does not answer over SSH ({n.last_error or 'not looked at yet'}); "
                       f"check its sshd and network, then `llmgw discover {n.name}`.")
        for g in (n.facts or {}).get("gpus", []):
            if not g.get("healthy"):
                out.append(f"node {n.name}: GPU {g.get('index', '?')} is unhealthy ({g.get('reason') or 'no reason given'}); "
                           f"nothing new is placed on it. Check `nvidia-smi` on the node.")
    for i in EngineInstall.select(EngineInstall, Node).join(Node).where(EngineInstall.state == "failed"):
        out.append(f"{i.engine} {i.version} on {i.node.name} failed to install: {i.detail or 'no detail'}. "
                   f"It is tried again by itself; `llmgw nodes` shows the attempts.")
    llamacpp_models = [m["name"] for m in models if m["engine"] == "llamacpp"]
    if llamacpp_models and not conf["engines"]["llamacpp"]:
        out.append(f"llamacpp is not installed anywhere: engines.llamacpp is empty in {conf['_path']}, "
                   f"and {', '.join(llamacpp_models)} need it. Set it to a llama.cpp release (e.g. "
                   f"\"b10991\").")
    for m in models:
        if m["ready"] < m["wanted"] and m["why"]:
            out.append(f"model {m['name']}: {m['ready']} of {m['wanted']} replicas ready: {m['why']} "
                       f"(`llmgw explain {m['name']}` says why node by node).")
    for r in replicas:
        if r.state in TROUBLED_REPLICAS:
            out.append(f"replica {r.name} on {r.node.name} is {r.state}: {r.detail or 'no detail'} "
                       f"(`llmgw logs {r.node.name} --source {r.name}` shows its engine's log).")
    for e in endpoints:
        if e["state"] not in ("ready", "pending"):
            out.append(f"endpoint {e['name']} is {e['state']}: {e['detail'] or 'no detail'}; "
                       f"fix it, or `llmgw endpoint remove {e['name']}`.")
    return out
