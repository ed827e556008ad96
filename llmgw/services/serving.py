"""What one replica's engine is started with: its files, port, cards and their share."""
from ..errors import LlmgwError
from ..plans import launch


def serve_of(node, replica, model, install, path):
    """Return the launch.Serve one replica's engine is started with on its node."""
    host = listen_host(node)
    return launch.Serve(
        engine=model.engine, binary=install.binary, model_path=path, model_name=model.name,
        port=replica.port, args=tuple(model.args or ()), host=host,
        cards=tuple(replica.gpu_uuids or ()), card_indexes=indexes_now(node, replica),
        context=model.context,
        card_fraction=card_fraction(node, replica), cuda=install.variant.startswith("cuda"),
        key_file=launch.key_path(node.base_dir, replica.unit) if replica.engine_key else "")


def mgmt_address(node):
    """Return the first address (IPv4 first) of the node's management interface as last
    discovered, or None when it has none or none is configured."""
    found = ((node.facts or {}).get("addresses") or {}).get(node.mgmt_interface or "") or []
    return found[0] if found else None


def listen_host(node):
    """Return the address an engine on the node listens on.

    A local node: loopback, the only way the control plane reaches it. A node with a
    management interface: that interface's address, so the engine is not on the node's other
    networks at all. Otherwise every address: the engine's own key keeps others out.
    """
    if node.transport == "local":
        return "127.0.0.1"
    if not node.mgmt_interface or "addresses" not in (node.facts or {}):
        # No interface named, or facts discovered before addresses were recorded (until the
        # next discovery): every address, and the gateway reaches it at the node's address.
        return "0.0.0.0"
    address = mgmt_address(node)
    if address is None:
        have = ", ".join(f"{i} ({', '.join(a)})" for i, a in
                         sorted(((node.facts or {}).get("addresses") or {}).items())) or "none found"
        raise LlmgwError(f"{node.name}'s management interface {node.mgmt_interface!r} has no address "
                         f"(interfaces with one: {have}); run add-node {node.name} again with the "
                         f"right --mgmt-iface, or with --mgmt-iface '' to listen on every address")
    return address


def indexes_now(node, replica):
    """Return the claimed cards' indexes as the node's nvidia-smi numbers them now."""
    now = {g.get("uuid"): g.get("index") for g in (node.facts or {}).get("gpus", [])}
    missing = [u for u in replica.gpu_uuids or [] if now.get(u) is None]
    if missing:
        raise LlmgwError(f"{', '.join(missing)} is no longer reported by nvidia-smi on "
                         f"{node.name}; placement moves the replica to other cards")
    return tuple(now[u] for u in replica.gpu_uuids or [])


def card_fraction(node, replica):
    """Return how much of its card(s) the engine may take: its share, or 0.9 of whole ones."""
    if not replica.gpu_uuids:
        return 0.0
    if not replica.gpu_memory_mb:
        return 0.9
    cards = {g.get("uuid"): g for g in (node.facts or {}).get("gpus", [])}
    total = (cards.get(replica.gpu_uuids[0]) or {}).get("memory_mib") or 0
    return int(100 * replica.gpu_memory_mb / total) / 100 if total else 0.0
