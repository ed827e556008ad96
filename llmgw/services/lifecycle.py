"""What happens to a node as a whole: lost and back, drained, distrusted.

The reconciler asks these once per pass; the replicas' own steps are in replicas.py.
"""
from ..models import Node, Replica, utcnow
from .nodes import log_event


class LostWatch:
    """Declares a node lost once neither SSH nor its engines answered for node_lost_after.

    Its replicas are then placed elsewhere. One SSH cannot reach whose engines still answer
    keeps them: requests still reach those engines, and nothing says they are gone.
    """

    def __init__(self, after):
        self.after = after
        # node id -> when SSH, or one of its engines over HTTP, last answered; never earlier
        # than this process's start, which has not watched before then.
        self.alive = {}
        self.started = utcnow()

    def answered(self, node_id):
        self.alive[node_id] = utcnow()

    def watch(self, node, reachable, impostor):
        if reachable:
            self.answered(node.id)
            return
        if node.lost_since is not None or node.last_seen is None or impostor:
            return
        last = max(self.alive.get(node.id, node.last_seen), node.last_seen, self.started)
        if (utcnow() - last).total_seconds() < self.after:
            return
        node.lost_since = utcnow()
        if Node.update(lost_since=node.lost_since).where(
                (Node.id == node.id) & Node.lost_since.is_null()).execute():
            # Rows already leaving are not moved by placement: lost now too, out of routing.
            Replica.update(state="lost", updated=utcnow(),
                           detail="its node was lost while it was leaving; stopped when it is back") \
                .where((Replica.node == node) & Replica.state.in_(("draining", "stopping"))).execute()
            log_event(node, f"lost: neither SSH nor its engines answered for {self.after} s (last: "
                            f"{node.last_error or 'no answer'}); its replicas are placed "
                            f"elsewhere, and its engines are stopped when it is back")


def distrust(node):
    """Take a node's replicas out of routing while its address offers another host key.

    The machine answering there may not be ours: user prompts must not go to it, however
    well its engines answer /health, until an operator re-pins the key.
    """
    detail = (f"out of routing: {node.addr} offers a host key other than the pinned one; re-pin it "
              f"with `flask llmgw add-node {node.name} --repin` once you know the machine is ours")
    Replica.update(state="unhealthy", updated=utcnow(), detail=detail) \
        .where((Replica.node == node) & (Replica.state.in_(("ready", "starting", "unhealthy")))
               & (Replica.detail != detail)).execute()
    # A draining one leaves for good (its slot has or gets a row elsewhere), out of routing.
    Replica.update(state="stopping", updated=utcnow(), detail="leaving: " + detail) \
        .where((Replica.node == node) & (Replica.state == "draining")).execute()


def drained(node):
    """Mark a draining node drained once no replica row is left on it (each is deleted only
    after its engine was stopped)."""
    if Replica.select().where(Replica.node == node).exists():
        return
    if Node.update(state="drained").where((Node.id == node.id) & (Node.state == "draining")).execute():
        log_event(node, "drained: every replica it ran serves elsewhere and its engines are "
                    f"stopped; `flask llmgw uncordon {node.name}` lets replicas back")
