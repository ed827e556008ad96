"""Which replica of which model runs on which node, and why a node was not chosen."""
import re
from dataclasses import dataclass


def slug(name):
    """Return a unit-name-safe form of a model name."""
    s = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return s or "model"


def replica_names(model_name, count):
    """Return the stable replica names of a model: slug-0, slug-1, …"""
    base = slug(model_name)
    return [f"{base}-{i}" for i in range(count)]


@dataclass(frozen=True)
class Candidate:
    node: str
    ok: bool
    reason: str = ""
    coming: bool = False  # reachable, with the engine being installed: ready soon


COMING = ("pending", "installing")


def candidates(nodes, engine):
    """Return a Candidate per node for an engine: reachable and with that engine ready.

    nodes: [{'name', 'reachable', 'installs': {engine: (state, detail)}}]
    """
    out = []
    for n in nodes:
        state, detail = n.get("installs", {}).get(engine, ("", ""))
        if not n.get("reachable"):
            out.append(Candidate(n["name"], False, "unreachable"))
        elif state != "ready":
            out.append(Candidate(n["name"], False, f"{engine} {state or 'not installed'}"
                                 + (f": {detail}" if detail else ""), coming=state in COMING))
        else:
            out.append(Candidate(n["name"], True))
    return out


def assign(names, existing, cands):
    """Place each replica name on a node; return ({replica name: node}, refusal sentence or '').

    existing: {replica name: node} already recorded, which stays where it is: after a restart
    the reconciler finds those units running and adopts them rather than starting another.
    A unit running with no row at all is not adopted (its port is unknown); it is stopped.

    While some nodes are still installing the engine, a ready node takes no more than its fair
    share (the replicas over the ready and coming nodes): the first node to finish installing
    must not take every replica for good. A coming node whose install fails stops counting.
    """
    ok = [c.node for c in cands if c.ok]
    coming = [c.node for c in cands if c.coming]
    share = -(-len(names) // (len(ok) + len(coming))) if coming else None  # ceiling division
    load = {n: 0 for n in ok}
    placed = {}
    for name in names:
        where = existing.get(name)
        if where is not None:
            placed[name] = where
            if where in load:
                load[where] += 1
    for name in names:
        if name in placed:
            continue
        if not ok:
            break
        node = min(ok, key=lambda n: (load[n], n))
        if share is not None and load[node] >= share:
            break
        placed[name] = node
        load[node] += 1
    refusal = ""
    if len(placed) < len(names):
        why = "; ".join(f"{c.node}: {c.reason}" for c in cands if not c.ok) or "no nodes"
        refusal = (f"waiting for a node to finish installing ({why})" if ok and coming
                   else f"no node can run it ({why})")
    return placed, refusal


def free_port(used, port_range):
    """Return the lowest port in 'lo-hi' not in used."""
    lo, hi = (int(x) for x in port_range.split("-"))
    for port in range(lo, hi + 1):
        if port not in used:
            return port
    raise ValueError(f"every port in {port_range} is taken on this node; widen reconciler.port_range")
