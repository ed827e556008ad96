"""Collecting weights no replica on a node has used for weights.keep_unused (plans/weights_gc)."""
import posixpath
import time

from ..models import Model, Node, NodeEvent, Replica
from ..plans import weights_gc
from . import weights
from ..plans.sizing import human_bytes

# One line per entry of <base>/models: bytes (the whole tree), mtime, name.
LIST_SCRIPT = ('cd "$0" 2>/dev/null || exit 0; for e in * .[!.]* ..?*; do [ -e "$e" ] || continue; '
               's=$(du -sb -- "$e" | cut -f1); t=$(stat -c %Y -- "$e"); '
               'printf "%s\\t%s\\t%s\\n" "$s" "$t" "$e"; done')


def models_dir(node):
    return posixpath.join(node.base_dir, "models")


def users_on(node):
    """Return {entry name: [replica names]} for the weights the node's replicas use or fetch."""
    out = {}
    # Weights named with --node-path are the operator's wherever they are: never collected,
    # even one that happens to lie under <base>/models.
    inside = models_dir(node).rstrip("/") + "/"
    for m in Model.select(Model.name, Model.source).where(Model.on_nodes == True):  # noqa: E712
        if m.source.startswith(inside):
            out.setdefault(m.source[len(inside):].split("/")[0], []).append(f"{m.name} (--node-path)")
    rows = Replica.select().where((Replica.node == node) & (Replica.state != "lost"))
    for r in rows:
        m = r.model
        if m.source and not m.on_nodes and m.sha256:
            name = posixpath.basename(weights.remote_path(node.base_dir, m))
            out.setdefault(name, []).append(r.name)
    return out


async def look(node, transport, keep, now=None):
    """List the node's weights and say of each whether it is collected; remember what is used."""
    now = time.time() if now is None else now
    listing = await transport.check(["sh", "-c", LIST_SCRIPT, models_dir(node)],
                                    what="listing the weights under " + models_dir(node))
    users = users_on(node)
    seen = dict(node.weights_seen or {})
    for name in users:
        seen[name] = now
    if seen != (node.weights_seen or {}):
        node.weights_seen = seen
        Node.update(weights_seen=seen).where(Node.id == node.id).execute()
    return weights_gc.plan(weights_gc.parse_listing(listing.stdout), users, seen, now, keep)


async def collect(node, transport, verdicts, keep):
    """Delete the entries the verdicts mark for collection; return their names."""
    gone = []
    for v in verdicts:
        if not v.collect:
            continue
        name = v.entry.name
        path = posixpath.join(models_dir(node), name)
        if weights_gc.stem(name) in users_on(node):
            continue  # placed here since the listing: it is kept
        copying = weights.copies.get((transport.name, posixpath.join(models_dir(node),
                                                                      weights_gc.stem(name))))
        if copying is not None and copying.locked():
            continue  # a copy onto it is under way
        await transport.check(["rm", "-rf", "--", path], what=f"deleting {path}")
        seen = dict(node.weights_seen or {})
        seen.pop(weights_gc.stem(name), None)
        node.weights_seen = seen
        Node.update(weights_seen=seen).where(Node.id == node.id).execute()
        NodeEvent.create(node=node, text=f"collected {name} ({human_bytes(v.entry.size)}): no "
                                         f"replica here used it for {int(time.time() - v.last_used)} s "
                                         f"(weights.keep_unused is {keep} s)")
        gone.append(name)
    return gone

