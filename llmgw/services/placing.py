"""The placement planner fed from the database, and its result written back to replica rows."""
import logging

from ..models import EngineInstall, Model, Node, NodeEvent, Replica, utcnow
from ..plans import placement
from ..plans.fleet import MIB, Need
from ..plans.replica_state import LEAVING

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
            "lost": node.lost_since is not None,
            "installs": {i.engine: (i.state, i.detail, i.variant) for i in installs},
            "labels": node.labels or {}, "memory_mb": (f.get("memory") or {}).get("total_mb", 0),
            "gpus": f.get("gpus", [])}


def claim_of(replica, model_name, node_name, leaving=None):
    if leaving is None:
        leaving = replica.state in LEAVING
    return {"replica": replica.slot or replica.name, "model": model_name, "node": node_name,
            "gpus": list(replica.gpu_uuids or []), "gpu_memory_mb": replica.gpu_memory_mb,
            "memory_mb": replica.memory_mb, "leaving": leaving}


def current_rows(replicas):
    """Return {slot: the row that fills it}: the one not leaving, else one that may come back.

    A row scaled away (stopping) whose slot is wanted again, or one draining on a node whose
    drain was called off, is taken back rather than a new engine started beside it.
    """
    current, back = {}, {}
    # Newest generation last, so that it wins should two rows fill one slot (the other is then
    # marked to leave); the same on every database, whatever order rows come back in.
    for r in sorted(replicas, key=lambda r: (r.generation, r.id)):
        slot = r.slot or r.name
        if r.state not in LEAVING:
            current[slot] = r
        elif r.state != "lost" and r.node.lost_since is None and r.node.state != "draining":
            back.setdefault(slot, r)
    return {**back, **current}


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
    current = {r.id for r in current_rows(replicas).values()}
    claims = [claim_of(r, r.model.name, r.node.name, leaving=r.id not in current)
              for r in replicas if r.state != "lost"]
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
    """Writes one pass's Result: new rows, moved claims, leaving rows marked, verdicts kept.

    An engine that must leave its node (drained, lost, or no longer allowed there) is never
    moved in place: its slot gets a row of a new generation where it was placed, so the two
    engines have different unit names, and the old row leaves on its own (serving on until the
    new one is ready when draining, finishing its requests when stopping, and stopped when its
    node is back when lost).
    """

    def __init__(self, nodes, models, replicas, port_range):
        self.nodes = {n.name: n for n in nodes}
        self.models = models
        self.replicas = replicas
        self.current = current_rows(replicas)
        self.extra = {r.id for r in replicas if r.state not in LEAVING
                      and self.current.get(r.slot or r.name) is not r}
        self.draining = {r.slot or r.name: r for r in replicas if r.state == "draining"}
        self.generations = {}
        for r in replicas:
            slot = r.slot or r.name
            self.generations[slot] = max(self.generations.get(slot, -1), r.generation)
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
        for slot in names:
            claim = result.claims.get(slot)
            row = self.current.get(slot)
            if row is not None and row.model_id != model.id:
                row = None  # a removed model's row, gone with it
            if slot in result.moved and row is not None:
                self._moved(model, slot, row, claim, result.moved[slot])
            elif slot in result.replaced and row is not None:
                self._replaced(model, slot, row, claim, result.replaced[slot], result)
            elif claim is not None:
                self._claimed(model, slot, row, claim)
        for row in [r for r in self.replicas if r.model_id == model.id and r.state != "stopping"
                    and r.state != "lost" and ((r.slot or r.name) not in names or r.id in self.extra)]:
            # A slot no longer wanted (or a second row filling one slot): whatever it was doing,
            # draining included (no replacement comes for a slot that is gone), it leaves.
            # Out of routing now (only ready replicas are routed to); its replicas task
            # stops it once it is idle or its grace is over, then forgets it.
            _leave(row, "stopping", "leaving: the model has fewer replicas; stopped once its "
                                    "requests are done")
        verdict = result.verdicts.get(model.name)
        if verdict is not None and verdict != model.verdict:
            if verdict["placed"] < verdict["wanted"]:
                log.warning("model %s: %s", model.name, verdict["summary"])
            Model.update(verdict=verdict).where(Model.id == model.id).execute()

    def _claimed(self, model, slot, row, claim):
        if row is not None and row.state in LEAVING:
            # Wanted again before it was gone: its engine still runs and is taken back.
            back = "ready" if row.state == "draining" else "pending"
            Replica.update(state=back, detail="wanted again before it stopped",
                           updated=utcnow()).where(Replica.id == row.id).execute()
            return
        if row is None:
            old = self.draining.get(slot)
            if old is not None and old.model_id == model.id:
                # Its drain found no place for it earlier; one has turned up now.
                self._replace(model, slot, old, claim, f"{old.node.name} is being drained")
                return
            self._new(model, slot, claim, f"placed on {claim['node']}" + _cards(claim))
            return
        # A kept claim whose share or RAM changed: written, so the start digest changes and
        # the engine is restarted with its new memory fraction.
        changed = {k: v for k, v in _fields(claim).items() if getattr(row, k) != v}
        if changed:
            Replica.update(**changed).where(Replica.id == row.id).execute()

    def _moved(self, model, slot, row, claim, why):
        old = row.node
        if claim is not None and claim["node"] == old.name:
            # Other cards on the same node: stopped now and started on them, same unit name.
            NodeEvent.create(node=old, text=f"stopped {row.name}: {why}; placed again{_cards(claim)}")
            Replica.update(state="moving", detail=f"moving: {why}", failures=0, **_fields(claim)) \
                .where(Replica.id == row.id).execute()
            return
        if row.state in LEAVING:
            pass  # leaving already (its grace counts from then), and taken back for nothing
        elif old.lost_since is not None:
            _leave(row, "lost", f"{why}: its engine, if it still runs, is stopped when the node is "
                                f"back")
        else:
            _leave(row, "stopping", f"leaving: {why}; stopped once its requests are done")
        if claim is None:
            if row.state not in LEAVING:
                NodeEvent.create(node=old, text=f"{row.name} leaves: {why}; no other place for it yet")
            return
        new = self._new(model, slot, claim, f"placed on {claim['node']}{_cards(claim)}: {why}")
        NodeEvent.create(node=old, text=f"{row.name} leaves: {why}; {new.name} placed on "
                                        f"{claim['node']}{_cards(claim)}")

    def _replaced(self, model, slot, row, claim, why, result):
        if claim is not None:
            self._replace(model, slot, row, claim, why)
            return
        verdict = (result.verdicts.get(model.name) or {}).get("summary", "")
        _leave(row, "draining", f"draining: {why}, but no other node can run it yet; serving until "
                                f"one can ({verdict})")
        NodeEvent.create(node=row.node, text=f"{row.name} draining: no other node can run it yet; "
                                             f"it serves here until one can")

    def _replace(self, model, slot, row, claim, why):
        new = self._new(model, slot, claim, f"placed on {claim['node']}{_cards(claim)}: "
                                            f"replaces {row.name} ({why})")
        _leave(row, "draining", f"draining: {why}; serving until {new.name} on {claim['node']} is ready")
        NodeEvent.create(node=row.node, text=f"{row.name} draining: {new.name} starts on "
                                             f"{claim['node']} to replace it")

    def _new(self, model, slot, claim, detail):
        node = self.nodes[claim["node"]]
        gen = self.generations.get(slot, -1) + 1
        self.generations[slot] = gen
        return Replica.create(name=slot if gen == 0 else f"{slot}-g{gen}", slot=slot, generation=gen,
                              model=model, node=node, port=self._port(node), detail=detail,
                              **_fields(claim))

    def _port(self, node):
        used = self.ports.setdefault(node.id, set())
        port = placement.free_port(used, self.port_range)
        used.add(port)
        return port


def _leave(row, state, detail):
    Replica.update(state=state, detail=detail, updated=utcnow()).where(Replica.id == row.id).execute()


def _fields(claim):
    return {"gpu_uuids": claim["gpus"], "gpu_indexes": claim["indexes"],
            "gpu_memory_mb": claim["gpu_memory_mb"], "memory_mb": claim["memory_mb"]}


def _cards(claim):
    if not claim["gpus"]:
        return ""
    return " on GPU " + ", ".join(str(i) for i in claim["indexes"])
