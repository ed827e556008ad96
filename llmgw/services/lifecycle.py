"""What happens to a node as a whole: cordoned, drained, lost and back, distrusted.

The reconciler asks these once per pass; the replicas' own steps are in replicas.py. Nothing
here reaches a node: the web pages use it too, and a web worker does not import SSH.
"""
from ..models import Node, NodeEvent, Replica, utcnow


def log_event(node, text):
    NodeEvent.create(node=node, text=text)


def cordon(node, on, who="the CLI"):
    """Cordon a node (no new replicas; what runs there stays) or uncordon it; return a sentence.

    Uncordoning also ends a drain, or what a finished one left: replicas may land there again.
    Replicas already replaced elsewhere still leave; one whose replacement found no place yet
    stays and serves.
    """
    wanted = "cordoned" if on else "ready"
    if node.state == wanted:
        return f"{node.name} is already {'cordoned' if on else 'uncordoned'}; nothing changed"
    Node.update(state=wanted, drain_timeout=0).where(Node.id == node.id).execute()
    was = f" (it was {node.state})" if node.state not in ("ready", "cordoned") else ""
    said = (f"cordoned by {who}{was}: no new replicas are placed here; those running stay"
            if on else f"uncordoned by {who}{was}: new replicas may be placed here again")
    log_event(node, said)
    return f"{node.name} {said}"


def drain(node, timeout, who="the CLI"):
    """Start draining a node; return a sentence saying what happens next.

    Each replica there gets a replacement on another node first; once that one serves, the
    old one leaves routing, has up to `timeout` seconds for its requests, and is stopped.
    """
    if node.state == "drained":
        return f"{node.name} is drained already; nothing runs there"
    if node.state == "draining" and node.drain_timeout == timeout:
        return f"{node.name} is already draining; nothing changed"
    Node.update(state="draining", drain_timeout=timeout).where(Node.id == node.id).execute()
    count = Replica.select().where(Replica.node == node).count()
    log_event(node, f"draining, asked by {who}: {count} replica(s) start elsewhere first; each "
                    f"old one then gets up to {timeout} s for its requests before it is stopped")
    return (f"{node.name} draining: its {count} replica(s) start on other nodes first, then leave "
            f"with up to {timeout} s for their requests; `flask llmgw nodes` shows it become "
            f"drained. A replica no other node can run stays and serves, and says why.")


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
