"""What changed between two discoveries of a node, in sentences for its log."""


def _gpu_key(g):
    return g.get("uuid") or g.get("bus_id") or str(g.get("index"))


def describe(old, new):
    """Return one sentence per change that matters to an operator (empty on first discovery)."""
    if not old:
        return []
    out = []
    o_os, n_os = old.get("os", {}), new.get("os", {})
    if (o_os.get("id"), o_os.get("version")) != (n_os.get("id"), n_os.get("version")):
        out.append(f"system changed from {o_os.get('pretty') or o_os.get('id')} "
                   f"to {n_os.get('pretty') or n_os.get('id')}")
    for key, label in (("nvidia_driver", "NVIDIA driver"), ("arch", "architecture")):
        if old.get(key, "") != new.get(key, ""):
            out.append(f"{label} changed from {old.get(key) or 'none'} to {new.get(key) or 'none'}")
    lost = sorted(set(old.get("cpu_flags", [])) - set(new.get("cpu_flags", [])))
    gained = sorted(set(new.get("cpu_flags", [])) - set(old.get("cpu_flags", [])))
    if lost:
        out.append(f"CPU no longer reports {', '.join(lost)} (was the VM's CPU type changed?)")
    if gained:
        out.append(f"CPU now reports {', '.join(gained)}")
    o_mem = old.get("memory", {}).get("total_mb")
    n_mem = new.get("memory", {}).get("total_mb")
    if o_mem and n_mem and abs(o_mem - n_mem) > max(o_mem, n_mem) * 0.02:
        out.append(f"memory changed from {o_mem} MB to {n_mem} MB")
    out += _gpu_changes(old.get("gpus", []), new.get("gpus", []))
    out += _ib_changes(old.get("infiniband", []), new.get("infiniband", []))
    if old.get("systemd") != new.get("systemd"):
        out.append("systemd is now PID 1" if new.get("systemd") else "systemd is no longer PID 1")
    return out


def _gpu_changes(old, new):
    out = []
    before = {_gpu_key(g): g for g in old}
    after = {_gpu_key(g): g for g in new}
    for key in sorted(set(before) - set(after)):
        out.append(f"GPU {before[key].get('name') or key} ({key}) is gone")
    for key in sorted(set(after) - set(before)):
        out.append(f"GPU {after[key].get('name') or key} ({key}) appeared")
    for key in sorted(set(before) & set(after)):
        b, a = before[key], after[key]
        if b.get("healthy") and not a.get("healthy"):
            out.append(f"GPU {a.get('index')} ({key}) became unhealthy: {a.get('reason')}")
        elif not b.get("healthy") and a.get("healthy"):
            out.append(f"GPU {a.get('index')} ({key}) is healthy again")
    return out


def _ib_changes(old, new):
    before = {(p["hca"], p["port"]): p["state"] for p in old}
    after = {(p["hca"], p["port"]): p["state"] for p in new}
    return [f"InfiniBand {hca} port {port} went from {before.get((hca, port), 'absent')} to "
            f"{after.get((hca, port), 'absent')}"
            for hca, port in sorted(set(before) | set(after))
            if before.get((hca, port)) != after.get((hca, port))]
