"""NVIDIA GPUs from `nvidia-smi --query-gpu=… --format=csv,noheader,nounits`."""
import re

QUERY_FIELDS = ("index", "uuid", "name", "memory.total", "memory.used", "driver_version",
                "pci.bus_id", "temperature.gpu", "ecc.errors.uncorrected.volatile.total")
QUERY_ARGV = ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_FIELDS),
              "--format=csv,noheader,nounits"]

# Marketed memory sizes; a card reports a little less than its size (reserved memory),
# so the class takes the nearest size at or above what it reports.
SIZES_GB = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141, 180, 192, 288)
BROKEN_MARKERS = ("[GPU requires reset]", "[Unknown Error]", "ERR!", "[GPU is lost]")
LOST = re.compile(r"Unable to determine the device handle for (?:GPU )?([0-9A-Fa-f:.]+): (.*)")


def class_name(name, memory_mib):
    """Return a short class like h100-80g, a100-80g, l4-24g, rtx4090-24g."""
    words = [w for w in re.split(r"[\s_-]+", name) if w and w.upper() not in ("NVIDIA", "GEFORCE", "TESLA")]
    model = ""
    for i, w in enumerate(words):
        if w.upper() == "RTX" and i + 1 < len(words):
            model = "rtx" + words[i + 1]
            break
        if re.match(r"^[A-Za-z]+\d", w):
            model = w
            break
    model = (model or (words[0] if words else "gpu")).lower()
    gib = memory_mib / 1024
    size = next((s for s in SIZES_GB if s >= gib * 0.985), round(gib))
    return f"{model}-{size}g"


def _number(text):
    text = text.strip()
    return int(float(text)) if re.fullmatch(r"-?\d+(\.\d+)?", text) else None


def parse_gpus(text):
    """Return one dict per GPU: index, uuid, name, class, memory, driver, bus, health and reason."""
    gpus = []
    for line in text.splitlines():
        if not line.strip():
            continue
        lost = LOST.search(line)
        if lost:
            gpus.append({"index": None, "uuid": "", "name": "", "class": "", "memory_mib": 0,
                         "memory_used_mib": 0, "driver": "", "bus_id": lost.group(1),
                         "temperature": None, "healthy": False,
                         "reason": f"nvidia-smi cannot reach the GPU at {lost.group(1)}: {lost.group(2).strip()}"})
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(QUERY_FIELDS):
            continue
        row = dict(zip(QUERY_FIELDS, fields))
        gpus.append(_gpu(row))
    return gpus


def _gpu(row):
    memory = _number(row["memory.total"]) or 0
    markers = sorted({m for v in row.values() for m in BROKEN_MARKERS if m in v})
    reasons = [f"nvidia-smi reports {m}" for m in markers]
    ecc = _number(row["ecc.errors.uncorrected.volatile.total"])
    if ecc:
        reasons.append(f"{ecc} uncorrected ECC errors since the driver loaded (reset the GPU or drain the node)")
    return {"index": _number(row["index"]), "uuid": row["uuid"], "name": row["name"],
            "class": class_name(row["name"], memory) if memory else "",
            "memory_mib": memory, "memory_used_mib": _number(row["memory.used"]) or 0,
            "driver": row["driver_version"], "bus_id": row["pci.bus_id"],
            "temperature": _number(row["temperature.gpu"]),
            "healthy": not reasons, "reason": "; ".join(reasons)}
