"""Which replica of which model runs on which node and cards, and why a node was not chosen.

Pure: node facts, model needs and the claims recorded on replica rows go in; claims, the
replicas that must move, and a verdict per model come out. Deterministic (ties go by name)
and stable: a replica keeps its node and cards while they still serve its model, however
much better another spot has become; it moves only when a card it holds turns unhealthy or
disappears, or the model now asks for something its claim does not give.
"""
import heapq
import re
from dataclasses import dataclass, field

from .fleet import Need, NodeState

__all__ = ["Need", "Result", "place", "node_lines", "replica_names", "slug", "free_port"]
GROUP_AFTER = 6  # refusal lines past this many are grouped by their wording


def slug(name):
    """Return a unit-name-safe form of a model name."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s or "model"


def replica_names(model_name, count):
    """Return the stable replica names of a model: slug-0, slug-1, …"""
    base = slug(model_name)
    return [f"{base}-{i}" for i in range(count)]


@dataclass
class Result:
    claims: dict = field(default_factory=dict)  # replica -> claim (node, gpus, indexes, …)
    moved: dict = field(default_factory=dict)  # replica -> why its old claim no longer holds
    # replica -> why it is placed anew while its old claim keeps serving (its node is draining)
    replaced: dict = field(default_factory=dict)
    verdicts: dict = field(default_factory=dict)  # model -> {summary, placed, wanted, nodes}
    states: dict = field(default_factory=dict)  # node -> NodeState after the pass
    # Which nodes pass the filters that do not change during a pass, per kind of need: a
    # fleet of a thousand nodes is filtered once per distinct need, not once per model.
    eligible: dict = field(default_factory=dict)


def place(nodes, needs, claims):
    """Return the Result of placing every model's replicas on the fleet.

    nodes: [{name, reachable, installs: {engine: (state, detail)}, labels, memory_mb, gpus}]
    needs: [Need]; claims: [{replica, model, node, gpus, gpu_memory_mb, memory_mb, leaving}].
    A claim's replica is its slot (model-0, model-1, …); one marked leaving belongs to an engine
    that is being stopped or replaced: its cards stay taken but it fills no slot.
    """
    result = Result(states={n["name"]: NodeState(n) for n in nodes})
    by_model = {n.model: n for n in needs}
    _keep(result, by_model, claims)
    order = sorted(needs, key=lambda n: (-n.gpus * (0 if n.shares else 1), -n.share_mb,
                                         -n.memory_mb, n.model))
    for need in order:
        _place_model(result, need)
    return result


def _keep(result, by_model, claims):
    """Re-take the recorded claims that still hold, first, so new replicas work around them."""
    for claim in sorted(claims, key=lambda c: (c["replica"], bool(c.get("leaving")))):
        need = by_model.get(claim["model"])
        if need is None:
            continue
        state = result.states.get(claim["node"])
        slot = claim["replica"]
        if claim.get("leaving") or slot in result.claims \
                or slot not in replica_names(need.model, need.replicas):
            # Surplus, replaced or a second claim on one slot: it finishes its requests on its
            # cards, which no other replica may take until it is gone.
            if state is not None:
                state.hold(claim)
            continue
        if state is not None and state.lost:
            result.moved[slot] = f"its node {state.name} is lost"
            continue
        if state is not None and state.draining:
            # It serves on until its replacement elsewhere does, so its cards stay taken.
            state.hold(claim)
            result.replaced[slot] = f"{state.name} is being drained"
            continue
        cards, why = (None, "its node is gone") if state is None else state.keep(need, claim)
        if why:
            result.moved[claim["replica"]] = why
        else:
            result.claims[claim["replica"]] = dict(
                claim, memory_mb=need.memory_mb, indexes=[c.index for c in cards],
                gpu_memory_mb=need.share_mb if cards else 0)


def _place_model(result, need):
    names = replica_names(need.model, need.replicas)
    missing = [n for n in names if n not in result.claims]
    if missing:
        ok, coming = _eligible(result, need)
        share = -(-need.replicas // (len(ok) + coming)) if coming and ok else None
        _fill(result, need, missing, ok, share)
    result.verdicts[need.model] = _verdict(result, need, names)


def _eligible(result, need):
    """Return (nodes passing the static filters, count of nodes still installing the engine)."""
    key = (need.engine, need.requires, need.gpus, need.classes, need.min_card_mb, need.share_mb)
    got = result.eligible.get(key)
    if got is None:
        states = result.states.values()
        got = result.eligible[key] = ([s for s in states if not s.static_refusal(need)],
                                      sum(1 for s in states if s.coming(need)))
    return got


def _preference(state, need):
    """Sort key: CPU models off GPU nodes, then fewest of this model there, then least loaded."""
    return (bool(state.cards) and not need.gpus, state.per_model.get(need.model, 0),
            state.replicas, state.name)


def _fill(result, need, missing, ok, share):
    heap = [(_preference(s, need), s.name) for s in ok]
    heapq.heapify(heap)
    by_name = {s.name: s for s in ok}
    for replica in missing:
        while heap:
            _, name = heapq.heappop(heap)
            state = by_name[name]
            if share is not None and state.per_model.get(need.model, 0) >= share:
                continue  # leave the rest to nodes still installing the engine
            cards, _ = state.check(need)
            if cards is None:
                continue  # full for this model; it stays full for the rest of this pass
            result.claims[replica] = dict(state.claim(need, replica, cards), replica=replica,
                                          model=need.model)
            heapq.heappush(heap, (_preference(state, need), name))
            break
        else:
            return


def _verdict(result, need, names):
    placed = [n for n in names if n in result.claims]
    if len(placed) == len(names):
        return {"summary": f"{len(placed)} of {len(names)} replicas placed", "placed": len(placed),
                "wanted": len(names), "nodes": _hosting_lines(result, need)}
    lines = node_lines(result, need)
    refusals = [{"node": line["node"], "reason": line["why"]} for line in lines if line["why"]]
    coming = any(s.coming(need) for s in result.states.values())
    why = _grouped(refusals) or "no nodes"
    if not placed:
        summary = (f"waiting for a node to finish installing ({why})" if coming
                   else f"no node can run it ({why})")
    else:
        summary = (f"{len(placed)} of {len(names)} replicas placed; "
                   + ("waiting for a node to finish installing" if coming
                      else "no node can run the rest") + f" ({why})")
    return {"summary": summary, "placed": len(placed), "wanted": len(names), "nodes": lines}


def _hosting_lines(result, need):
    where = {}
    # A model's claims are found by its replica names: scanning the fleet's claims once per
    # model was most of an incremental pass over 1,000 nodes.
    for replica in replica_names(need.model, need.replicas):
        claim = result.claims.get(replica)
        if claim is not None:
            where.setdefault(claim["node"], []).append(_replica_text(claim))
    return [{"node": node, "ok": True, "why": "", "reason": "runs " + ", ".join(reps)}
            for node, reps in sorted(where.items())]


def _replica_text(claim):
    if not claim.get("gpus"):
        return claim["replica"]
    cards = ", ".join(str(i) for i in claim.get("indexes") or [])
    shared = f", {claim['gpu_memory_mb']} MiB of it" if claim.get("gpu_memory_mb") else ""
    return f"{claim['replica']} on GPU {cards}{shared}"


def _grouped(refusals):
    """Return '; '-joined 'node: reason' lines, grouping nodes that share a reason when many."""
    if len(refusals) <= GROUP_AFTER:
        return "; ".join(f"{r['node']}: {r['reason']}" for r in refusals)
    groups = {}
    for r in refusals:
        groups.setdefault(r["reason"], []).append(r["node"])
    parts = []
    for reason, names in groups.items():
        who = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        parts.append(f"{who}: {reason}")
    return "; ".join(parts)


def node_lines(result, need):
    """Return every node's verdict for one model after a pass: what it runs, and why not more.

    Each line: node, ok (it could take one more replica now), why (the refusal, or ''), and
    reason (the sentence for people, which also says what it already runs).
    """
    hosting = {line["node"]: line["reason"] for line in _hosting_lines(result, need)}
    lines = []
    for state in sorted(result.states.values(), key=lambda s: s.name):
        why = state.why_not(need)
        runs = hosting.get(state.name)
        if runs:
            reason = runs + ("; room for another" if not why else f"; no more: {why}")
        else:
            reason = why or "could take a replica"
        lines.append({"node": state.name, "ok": not why, "why": why, "reason": reason})
    return lines


def free_port(used, port_range):
    """Return the lowest port in 'lo-hi' not in used."""
    lo, hi = (int(x) for x in port_range.split("-"))
    for port in range(lo, hi + 1):
        if port not in used:
            return port
    raise ValueError(f"every port in {port_range} is taken on this node; widen reconciler.port_range")
