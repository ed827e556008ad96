"""What one replica's engine is started with: its files, port, cards and their share."""
from ..errors import LlmgwError
from ..plans import launch


def serve_of(node, replica, model, install, path):
    """Return the launch.Serve one replica's engine is started with on its node."""
    # The control plane reaches a local node on loopback; nothing else should.
    host = "127.0.0.1" if node.transport == "local" else "0.0.0.0"
    return launch.Serve(
        engine=model.engine, binary=install.binary, model_path=path, model_name=model.name,
        port=replica.port, args=tuple(model.args or ()), host=host,
        cards=tuple(replica.gpu_uuids or ()), card_indexes=indexes_now(node, replica),
        context=model.context,
        card_fraction=card_fraction(node, replica), cuda=install.variant.startswith("cuda"))


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
