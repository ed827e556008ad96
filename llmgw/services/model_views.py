"""A model and its replicas as the CLI's --json and the pages show them."""
from ..models import Replica
from . import placing
from ..plans.sizing import human_bytes


def model_view(m):
    """Return one model as a dict for --json and the pages."""
    reps = list(Replica.select().where(Replica.model == m).order_by(Replica.name))
    return {"name": m.name, "engine": m.engine, "source": m.source, "on_nodes": m.on_nodes,
            "sha256": m.sha256, "replicas": m.replicas, "ready": sum(r.state == "ready" for r in reps),
            "gpus": m.gpus, "gpu_classes": m.gpu_classes or [], "min_gpu_memory_mb": m.min_gpu_memory_mb,
            "memory_mb": m.memory_mb, "context": m.context, "requires": m.requires or {},
            "max_per_node": m.max_per_node, "share_gpu": m.share_gpu, "args": m.args or [],
            "fallbacks": m.fallbacks or [], "origin": m.origin or "cli", "estimate": m.estimate,
            "needs": needs_text(m), "placement": (m.verdict or {}).get("summary", "not placed yet"),
            "replica_rows": [replica_view(r) for r in reps]}


def replica_view(r):
    return {"name": r.name, "node": r.node.name, "model": r.model.name, "port": r.port, "state": r.state, "detail": r.detail,
            "gpu_indexes": r.gpu_indexes or [], "gpu_uuids": r.gpu_uuids or [],
            "gpu_memory_mb": r.gpu_memory_mb, "memory_mb": r.memory_mb, "endpoint": r.endpoint,
            "progress": progress_of(r), "progress_text": progress_text(r)}


def progress_of(r):
    """Return a copy's progress while the replica is fetching its weights, else None."""
    return r.progress if r.state == "fetching" and r.progress else None


def progress_text(r):
    """Return 'copying 1.2 GiB of 4.0 GiB (30%), 85.0 MiB/s, 35 s left; resumed at …', or ''."""
    p = progress_of(r)
    if not p:
        return ""
    total = p.get("total") or 0
    if total:
        text = (f"copying {human_bytes(p['done'])} of {human_bytes(total)} "
                f"({int(100 * p['done'] / total)}%), {human_bytes(p.get('rate', 0))}/s")
    else:  # the node downloads it and the size is not known here
        text = f"downloaded {human_bytes(p['done'])} on the node, {human_bytes(p.get('rate', 0))}/s"
    if p.get("eta"):
        text += f", {p['eta']} s left"
    if p.get("resumed_from"):
        text += f"; resumed at {human_bytes(p['resumed_from'])}"
    return text


def needs_text(m):
    need = placing.need_of(m)
    parts = [f"{m.replicas} replica(s) of {m.engine}"]
    if need.shares:
        parts.append(f"{need.share_mb} MiB of one {need.class_words()} card, shared")
    elif need.gpus:
        parts.append(f"{need.gpus} × {need.class_words()} each")
    else:
        parts.append("CPU only")
    if need.min_card_mb and not need.shares:
        parts.append(f"≥ {need.min_card_mb} MiB per card")
    if need.memory_mb:
        parts.append(f"{need.memory_mb} MiB RAM" + ("" if m.memory_mb else " (estimated)"))
    parts += [f"{k}={v}" for k, v in need.requires]
    if need.max_per_node:
        parts.append(f"at most {need.max_per_node} per node")
    return ", ".join(parts)
