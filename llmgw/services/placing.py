"""The placement planner fed from the database, and its result written back to replica rows."""
import logging

from ..models import EngineInstall, Model, Node, NodeEvent, Replica, utcnow
from ..plans import placement
from ..plans.fleet import MIB, Need

log = logging.getLogger("llmgw.placing")


def need_of(model):
    """Return the planner's Need for a Model row (sizes from its estimate where not given)."""
    est = model.estimate or {}
    share = 0
    if model.share_gpu:
        share = model.min_gpu_memory_mb or -(-int(est.get("gpu_bytes", 0)) // MIB)
    memory = model.memory_mb or -(-int(est.get("host_bytes", 0)) // MIB)
    return Need(model=model.name, engine=model.engine, replicas=model.replicas,
                gpus=1 if model.share_gpu else model.gpus, classes=tuple(model.gpu_classes or ()),
                min_card_mb=model.min_gpu_memory_mb, share_mb=share, memory_mb=memory,
                requires=tuple(sorted((model.requires or {}).items())),
                max_per_node=model.max_per_node)


def facts_of(node, installs):
    """Return what the planner knows of a node."""
    f = node.facts or {}
    return {"name": node.name, "reachable": node.reachable, "state": node.state,
            "installs": {i.engine: (i.state, i.detail, i.variant) for i in installs},
            "labels": node.labels or {}, "memory_mb": (f.get("memory") or {}).get("total_mb", 0),
            "gpus": f.get("gpus", [])}


def claim_of(replica, model_name, node_name):
    return {"replica": replica.name, "model": model_name, "node": node_name,
            "gpus": list(replica.gpu_uuids or []), "gpu_memory_mb": replica.gpu_memory_mb,
            "memory_mb": replica.memory_mb}


def snapshot():
    """Read what placement needs once: (node rows, model rows, replica rows, installs by node)."""
    nodes = list(Node.select().order_by(Node.name))
    models = list(Model.select().order_by(Model.name))
    replicas = list(Replica.select(Replica, Model, Node).join(Model).switch(Replica).join(Node))
    installs = {}
    for row in EngineInstall.select():
        installs.setdefault(row.node_id, []).append(row)
    return nodes, models, replicas, installs


def plan(nodes, models, replicas, installs):
    """Run the planner over one snapshot (no database access); return its Result."""
    facts = [facts_of(n, installs.get(n.id, [])) for n in nodes]
    claims = [claim_of(r, r.model.name, r.node.name) for r in replicas]
    return placement.place(facts, [need_of(m) for m in models], claims)


def explain(model, run=None):
    """Return (the model's verdict lines for every node, the pass's Result) from the database now.

    run(fn, *args) runs the pure planning part: the web passes one that keeps it off the
    gevent hub, since a pass over a thousand nodes takes half a second of CPU.
    """
    snap = snapshot()
    need = need_of(model)

    def work():
        result = plan(*snap)
        return placement.node_lines(result, need), result
    return run(work) if run else work()


class Applier:
    """Writes one pass's Result: new rows, moved claims, surplus rows gone, verdicts kept."""

    def __init__(self, nodes, models, replicas, port_range):
        self.nodes = {n.name: n for n in nodes}
        self.models = models
        self.rows = {r.name: r for r in replicas}
        self.port_range = port_range
        self.ports = {}
        for r in replicas:
            self.ports.setdefault(r.node_id, set()).add(r.port)

    def apply(self, result):
        for model in self.models:
            try:
                self._model(model, result)
            except Exception:  # one model's trouble must not stop the others being placed
                log.exception("placing model %s failed", model.name)

    def _model(self, model, result):
        names = placement.replica_names(model.name, model.replicas)
        for name in names:
            claim = result.claims.get(name)
            row = self.rows.get(name)
            if name in result.moved and row is not None:
                self._moved(row, claim, result.moved[name])
            elif claim is not None:
                self._claimed(model, name, row, claim)
        for row in [r for r in self.rows.values() if r.model_id == model.id and r.name not in names]:
            if row.state != "stopping":
                # Out of routing now (only ready replicas are routed to); its replicas task
                # stops it once it is idle or its grace is over, then forgets it.
                Replica.update(state="stopping", updated=utcnow(),
                               detail="leaving: the model has fewer replicas; stopped once its "
                                      "requests are done") \
                    .where(Replica.id == row.id).execute()
        verdict = result.verdicts.get(model.name)
        if verdict is not None and verdict != model.verdict:
            if verdict["placed"] < verdict["wanted"]:
                log.warning("model %s: %s", model.name, verdict["summary"])
            Model.update(verdict=verdict).where(Model.id == model.id).execute()

    def _claimed(self, model, name, row, claim):
        if row is not None and row.state == "stopping":
            # Wanted again before it was gone: its engine still runs and is taken back.
            Replica.update(state="pending", detail="wanted again before it stopped",
                           updated=utcnow()).where(Replica.id == row.id).execute()
            return
        if row is None:
            node = self.nodes[claim["node"]]
            Replica.create(name=name, model=model, node=node, port=self._port(node),
                           detail=f"placed on {node.name}" + _cards(claim), **_fields(claim))
        else:
            # A kept claim whose share or RAM changed: written, so the start digest changes
            # and the engine is restarted with its new memory fraction.
            changed = {k: v for k, v in _fields(claim).items() if getattr(row, k) != v}
            if changed:
                Replica.update(**changed).where(Replica.id == row.id).execute()

    def _moved(self, row, claim, why):
        old = row.node
        if claim is None:
            NodeEvent.create(node=old, text=f"stopped {row.name}: {why}; no other place for it yet")
            row.delete_instance()  # its unit is an orphan now; the model's verdict says why it waits
            return
        node = self.nodes[claim["node"]]
        where = ("" if node.name == old.name else f" on {node.name}") + _cards(claim)
        NodeEvent.create(node=old, text=f"stopped {row.name}: {why}; placed again{where}")
        fields = _fields(claim)
        if node.name != old.name:
            fields.update(node=node, port=self._port(node))
        Replica.update(state="moving", detail=f"moving: {why}", failures=0, **fields) \
            .where(Replica.id == row.id).execute()

    def _port(self, node):
        used = self.ports.setdefault(node.id, set())
        port = placement.free_port(used, self.port_range)
        used.add(port)
        return port


def _fields(claim):
    return {"gpu_uuids": claim["gpus"], "gpu_indexes": claim["indexes"],
            "gpu_memory_mb": claim["gpu_memory_mb"], "memory_mb": claim["memory_mb"]}


def _cards(claim):
    if not claim["gpus"]:
        return ""
    return " on GPU " + ", ".join(str(i) for i in claim["indexes"])
