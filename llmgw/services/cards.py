"""What a node's cards are and who holds them, as the pages and `nodes --json` show it."""
from ..models import Replica


def claims_by_card(replicas):
    """Return {uuid: [replica names]} from replica rows."""
    held = {}
    for r in replicas:
        for uuid in r.gpu_uuids or []:
            held.setdefault(uuid, []).append(r.name)
    return held


def card_rows(node, held):
    """Return one row per card of the node: index, class, memory, health, who claims it."""
    rows = []
    for g in (node.facts or {}).get("gpus", []):
        rows.append({"index": g.get("index"), "uuid": g.get("uuid", ""), "name": g.get("name", ""),
                     "class": g.get("class", ""), "bus_id": g.get("bus_id", ""),
                     "memory_mib": g.get("memory_mib", 0), "memory_used_mib": g.get("memory_used_mib", 0),
                     "healthy": bool(g.get("healthy")), "reason": g.get("reason", ""),
                     "claimed_by": sorted(held.get(g.get("uuid"), [])) if g.get("uuid") else []})
    return rows


def totals(rows):
    """Return {total, healthy, free, by_class: {class: [free, total]}} for card rows."""
    out = {"total": len(rows), "healthy": 0, "free": 0, "by_class": {}}
    for r in rows:
        cls = out["by_class"].setdefault(r["class"] or "unknown", [0, 0])
        cls[1] += 1
        if r["healthy"]:
            out["healthy"] += 1
            if not r["claimed_by"]:
                out["free"] += 1
                cls[0] += 1
    return out


def node_cards(node):
    """Return the card rows of one node, with the replicas holding each."""
    reps = Replica.select(Replica.name, Replica.gpu_uuids).where(Replica.node == node)
    return card_rows(node, claims_by_card(reps))


def fleet_cards(nodes):
    """Return {node id: card rows} for many nodes with one query for the claims."""
    held = claims_by_card(Replica.select(Replica.name, Replica.gpu_uuids))
    return {n.id: card_rows(n, held) for n in nodes}
