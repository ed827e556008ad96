"""How much memory one replica of a model needs, and which GPU classes can hold it.

An estimate, not a promise: weights + a KV cache for the whole context at 16-bit + a margin
for compute buffers. Engines differ by a few percent; sliding-window and quantised KV
caches need less than this says, so it errs towards refusing too early rather than late.
Sizes print in decimal units (GB = 10^9 bytes), the per-token cache in KiB.
"""
import math

MiB = 1024 ** 2
GiB = 1024 ** 3
DEFAULT_CONTEXT = 4096
# The card memory an engine can really use: the driver, the CUDA context and fragmentation
# take the rest.
USABLE = 0.9
# Tensor-parallel sizes: engines split attention heads evenly, so powers of two.
TP_SIZES = (1, 2, 4, 8)


def kv_bytes_per_token(meta):
    """Return the KV cache bytes one token takes: K and V for every layer."""
    return 2 * meta["layers"] * meta["kv_heads"] * meta["head_dim"] * meta.get("kv_dtype_bytes", 2)


def estimate(meta, context=0, gpus=1):
    """Return the memory one replica needs at a context length, on GPUs and in host RAM."""
    context = context or meta.get("context_trained") or DEFAULT_CONTEXT
    weights = meta["weights_bytes"]
    per_token = kv_bytes_per_token(meta)
    overhead = max(512 * MiB, weights // 20)
    gpu_bytes = weights + per_token * context + overhead
    # On GPUs the host keeps a loading buffer and the engine's own state; a CPU replica
    # holds everything in RAM.
    host = gpu_bytes if gpus == 0 else max(2 * GiB, weights // 10)
    return {"context": context, "gpus": gpus, "weights_bytes": weights, "kv_per_token": per_token,
            "kv_bytes": per_token * context, "overhead_bytes": overhead,
            "gpu_bytes": gpu_bytes, "host_bytes": host}


def usable_bytes(card_mib, cards=1, usable=USABLE):
    """Return the bytes an engine can use on `cards` cards of card_mib MiB."""
    return cards * card_mib * MiB * usable


def cards_needed(gpu_bytes, card_mib, usable=USABLE, max_cards=8):
    """Return the smallest tensor-parallel card count that holds gpu_bytes, or None."""
    for n in TP_SIZES:
        if n <= max_cards and gpu_bytes <= usable_bytes(card_mib, n, usable):
            return n
    return None


def fits_by_class(gpu_bytes, classes):
    """Return, per GPU class, how many of its cards one replica needs, and why not if none."""
    out = []
    for c in sorted(classes, key=lambda c: c["class"]):
        n = cards_needed(gpu_bytes, c["memory_mib"], max_cards=c["cards_max"])
        out.append({"class": c["class"], "memory_mib": c["memory_mib"], "cards": n,
                    "per_card_bytes": gpu_bytes / n if n else None,
                    "why": "" if n else _why_not(gpu_bytes, c)})
    return out


def _why_not(gpu_bytes, c):
    if c["memory_mib"] <= 0:
        return f"{c['class']} reports no memory; check nvidia-smi on its nodes"
    card = f"{c['class']} cards ({human_bytes(c['memory_mib'] * MiB)} each)"
    n = cards_needed(gpu_bytes, c["memory_mib"])
    if n is None:
        least = math.ceil(gpu_bytes / usable_bytes(c["memory_mib"]))
        return (f"needs {least} or more {card}; one replica spans at most {TP_SIZES[-1]} "
                "cards of one node")
    return f"needs {n} {card}; the most healthy on one node is {c['cards_max']}"


def declared_warning(est, gpus, card_mib, cls=""):
    """Return a warning when gpus cards of card_mib cannot hold the estimate, else ''."""
    if gpus <= 0 or card_mib <= 0:
        return ""
    room = usable_bytes(card_mib, gpus)
    if est["gpu_bytes"] <= room:
        return ""
    card = cls or f"{human_bytes(card_mib * MiB)} card"
    return (f"the estimate is {human_bytes(est['gpu_bytes'])} per replica, more than {gpus} × "
            f"{card} ({human_bytes(room)} usable) hold; it will likely fail to load "
            "(raise --gpus or pick a larger --gpu-class)")


def human_bytes(n):
    """Return n bytes in decimal units to three figures: '4.68 GB', '17.9 GB', '537 MB'."""
    for unit, size in (("TB", 10 ** 12), ("GB", 10 ** 9), ("MB", 10 ** 6), ("kB", 10 ** 3)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.{2 if v < 10 else 1 if v < 100 else 0}f} {unit}"
    return f"{int(n)} B"


def human_count(n):
    """Return a parameter count as '8.03 B', '135.2 M' or '4096'."""
    if n >= 10 ** 9:
        return f"{n / 10 ** 9:.2f} B"
    if n >= 10 ** 6:
        return f"{n / 10 ** 6:.1f} M"
    return str(n)


def describe(meta, est, fits):
    """Return the lines `flask llmgw model plan` prints for a model's sizing."""
    return [_row("weights", f"{human_bytes(meta['weights_bytes'])}  ({meta['format']}, "
                 f"{meta['quantisation']}, {human_count(meta['parameters'])} parameters, "
                 f"{meta['architecture']})"),
            _row("layers", f"{meta['layers']} · heads {meta['heads']} · kv heads "
                 f"{meta['kv_heads']} · head dim {meta['head_dim']} · embedding "
                 f"{meta['embedding']}"),
            _row("KV cache", _kv_line(meta, est)),
            _row("one replica", _replica_line(est)),
            *_fit_lines(est, fits)]


def _row(name, value):
    return f"{name:<13} {value}"


def _kv_line(meta, est):
    trained = meta.get("context_trained") or 0
    note = (" (the model does not say its trained context)" if not trained
            else f" (beyond the {trained} it was trained for)" if est["context"] > trained
            else f" (trained for {trained})")
    return (f"{est['kv_per_token'] / 1024:g} KiB per token · {human_bytes(est['kv_bytes'])} "
            f"at {est['context']} tokens{note}")


def _replica_line(est):
    parts = f"weights + KV cache + {human_bytes(est['overhead_bytes'])} buffers"
    if est.get("gpus", 1) == 0:
        return f"{human_bytes(est['host_bytes'])} host RAM on CPU ({parts})"
    return (f"{human_bytes(est['gpu_bytes'])} on GPUs ({parts}); "
            f"{human_bytes(est['host_bytes'])} host RAM")


def _fit_lines(est, fits):
    if not fits:
        return [_row("fits on", "no GPU in the cluster; a CPU replica needs "
                     f"{human_bytes(est['gpu_bytes'])} RAM")]
    ok = [f"{f['class']}: {f['cards']} card{'s' if f['cards'] > 1 else ''}"
          for f in fits if f["cards"]]
    return ([_row("fits on", " · ".join(ok) or "no GPU class in the cluster")]
            + [_row("cannot use", f"{f['class']}: {f['why']}") for f in fits if not f["cards"]])
