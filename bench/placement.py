"""Time the placement planner on a synthetic fleet (stdlib only, plus llmgw).

Builds the same fleet on every run (fixed random numbers): 30 % 8×H100 nodes, 30 % 4×L4 nodes
and 40 % CPU-only nodes, their GPUs written as `nvidia-smi --query-gpu` text and read back with
llmgw.facts.gpu.parse_gpus, about 2 % of the cards unhealthy with ECC errors, pool and zone
labels, a few nodes unreachable or still installing an engine; and models with mixed needs,
about four replicas each. Then times, each over several runs (min / median / max):

  full         placement.place() from scratch, no claims
  incremental  the claims of a full pass fed back, after 3 claimed cards turned unhealthy,
               10 models got one more replica and one node that ran replicas went away
  explain      placement.node_lines() for one model

and checks every pass against the invariants (no card held twice, shares within the card,
no unhealthy card, labels and classes honoured, RAM and max-per-node kept), so it cannot time
a planner that is wrong. The digest line hashes each pass's claims, moves and verdicts: equal
digests before and after a planner change mean the change kept its output.

    .venv/bin/python bench/placement.py [--nodes 1000] [--models 500] [--runs 5] [--profile]
"""
import argparse
import cProfile
import dataclasses
import gc
import hashlib
import json
import pstats
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.facts.gpu import parse_gpus  # noqa: E402
from llmgw.plans import placement  # noqa: E402
from llmgw.plans.fleet import Need  # noqa: E402

TARGET_S = 1.0  # a full pass on 1,000 nodes and 500 models, on 2 cores
GIB = 1024
KINDS = {  # name: (card, cards per node, node RAM in MiB, engines)
    "h100": (("NVIDIA H100 80GB HBM3", 81559, "550.54.15"), 8, 2048 * GIB, ("vllm", "llamacpp")),
    "l4": (("NVIDIA L4", 23034, "550.90.07"), 4, 384 * GIB, ("vllm", "llamacpp")),
    "cpu": (None, 0, 512 * GIB, ("llamacpp",)),
}
BUSES = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")


# --- the fleet ------------------------------------------------------------------------------
def fleet(rng, count):
    """Return node specs: what each node's nvidia-smi and facts would say."""
    kinds = rng.choices(("h100", "l4", "cpu"), weights=(30, 30, 40), k=count)
    return [node_spec(rng, f"node-{i:04d}", kind) for i, kind in enumerate(kinds)]


def node_spec(rng, name, kind):
    """Return one node's spec: cards as nvidia-smi rows, labels, engines and reachability."""
    card, per_node, ram, engines = KINDS[kind]
    rows = []
    for index in range(per_node):
        ecc = rng.choice((2, 12, 48)) if rng.random() < 0.02 else 0
        rows.append({"index": index, "uuid": uuid(rng), "card": card, "bus": BUSES[index],
                     "temperature": rng.randint(28, 45), "ecc": ecc})
    installs = {e: ("ready", "") for e in engines}
    if rng.random() < 0.02:  # an engine still installing on a few nodes
        installs[rng.choice(engines)] = ("installing", "")
    return {"name": name, "kind": kind, "rows": rows, "memory_mb": ram,
            "reachable": rng.random() >= 0.01, "installs": installs,
            "labels": {"pool": "prod" if rng.random() < 0.7 else "dev", "zone": rng.choice("ab")}}


def uuid(rng):
    """Return a GPU UUID in nvidia-smi's format."""
    h = f"{rng.getrandbits(128):032x}"
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def smi_text(rows):
    """Return the `nvidia-smi --query-gpu=… --format=csv,noheader,nounits` output for rows."""
    return "".join(f"{r['index']}, {r['uuid']}, {r['card'][0]}, {r['card'][1]}, 0, {r['card'][2]}, "
                   f"00000000:{r['bus']}:00.0, {r['temperature']}, {r['ecc']}\n" for r in rows)


def node_facts(spec):
    """Return the planner's node facts for a spec, its GPUs parsed as the agent would."""
    return {"name": spec["name"], "reachable": spec["reachable"], "installs": dict(spec["installs"]),
            "labels": dict(spec["labels"]), "memory_mb": spec["memory_mb"],
            "gpus": parse_gpus(smi_text(spec["rows"]))}


# --- the models -----------------------------------------------------------------------------
def models(rng, count):
    """Return needs: CPU models, card shares, and 1-, 2-, 4- and 8-card models."""
    kinds = rng.choices(("cpu", "share", "g1", "g2", "g4", "g8"), weights=(30, 10, 25, 15, 12, 8), k=count)
    return [need(rng, f"model-{i:03d}-{kind}", kind) for i, kind in enumerate(kinds)]


def need(rng, name, kind):
    """Return one model's Need for its kind, with random labels, card sizes and spreading."""
    replicas = rng.choice((1, 1, 2, 2, 3)) if kind == "g8" else rng.choice((1, 2, 3, 4, 4, 5, 6, 8))
    spec = {"model": name, "replicas": replicas, "requires": requires(rng),
            "max_per_node": rng.choices((0, 1, 2), weights=(65, 25, 10))[0]}
    if kind == "cpu":
        return Need(engine="llamacpp", memory_mb=rng.choice((4, 8, 16, 32, 64)) * GIB, **spec)
    spec.update(engine=rng.choice(("vllm", "vllm", "llamacpp")), memory_mb=rng.choice((16, 32, 64)) * GIB)
    if kind == "share":
        return Need(gpus=1, share_mb=rng.choice((6, 8, 10, 12, 16, 20)) * GIB,
                    classes=rng.choice(((), (), ("l4-24g",), ("h100-80g",))), **spec)
    gpus = int(kind[1:])
    classes = rng.choice(((), ("h100-80g",), ("h100-80g",), ("l4-24g",)) if gpus < 8 else ((), ("h100-80g",)))
    min_card = rng.choice((0, 0, 0, 20000, 40000)) if not classes else 0
    return Need(gpus=gpus, classes=classes, min_card_mb=min_card, **spec)


def requires(rng):
    """Return a model's label requirements: mostly none, some pool and zone, a rare impossible one."""
    return rng.choices(((), (("pool", "prod"),), (("pool", "prod"), ("zone", "b")), (("zone", "a"),),
                        (("pool", "gpu-big"),)), weights=(50, 30, 10, 9, 1))[0]


# --- the change between passes -----------------------------------------------------------------
def changed(rng, specs, needs, result):
    """Return (specs, needs, gone node, sick cards) after 3 claimed cards turn unhealthy, 10 models
    grow and a node that ran replicas goes away."""
    claimed = sorted({(c["node"], u) for c in result.claims.values() for u in c["gpus"]})
    hosts = sorted({c["node"] for c in result.claims.values()})
    gone = rng.choice(hosts)
    sick = set(rng.sample([x for x in claimed if x[0] != gone], 3))
    out = []
    for spec in specs:
        if spec["name"] == gone:
            continue
        if any(n == spec["name"] for n, _ in sick):
            spec = dict(spec, rows=[dict(r, ecc=7) if (spec["name"], r["uuid"]) in sick else r
                                    for r in spec["rows"]])
        out.append(spec)
    grow = set(rng.sample(range(len(needs)), min(10, len(needs))))
    needs = [dataclasses.replace(n, replicas=n.replicas + 1) if i in grow else n
             for i, n in enumerate(needs)]
    return out, needs, gone, sick


def fed_back(result):
    """Return the claims of a pass as the replica rows would record them."""
    return [dict(c, replica=r) for r, c in result.claims.items()]


# --- invariants -----------------------------------------------------------------------------
def check(nodes, needs, result):
    """Assert that every claim of a pass is one the planner may make; return cards claimed."""
    by_node = {n["name"]: n for n in nodes}
    by_model = {n.model: n for n in needs}
    cards = {g["uuid"]: (n["name"], g) for n in nodes for g in n["gpus"]}
    whole, shared, ram, per = set(), Counter(), Counter(), Counter()
    for replica, claim in result.claims.items():
        need, node = by_model[claim["model"]], by_node[claim["node"]]
        assert replica in placement.replica_names(need.model, need.replicas), replica
        engine = node["installs"].get(need.engine, ("",))[0]
        assert node["reachable"] and engine == "ready", (replica, node["name"])
        assert all(node["labels"].get(k) == v for k, v in need.requires), (replica, node["labels"])
        assert len(claim["gpus"]) == need.gpus, (replica, claim["gpus"])
        for u in claim["gpus"]:
            where, gpu = cards[u]
            assert where == node["name"] and gpu["healthy"], (replica, u)
            assert not need.classes or gpu["class"] in need.classes, (replica, gpu["class"])
            assert gpu["memory_mib"] >= max(need.min_card_mb, need.share_mb), (replica, u)
            if need.shares:
                shared[u] += need.share_mb
            else:
                assert u not in whole, f"{u} claimed whole twice"
                whole.add(u)
        ram[node["name"]] += need.memory_mb
        per[node["name"], need.model] += 1
        assert not need.max_per_node or per[node["name"], need.model] <= need.max_per_node, replica
    assert not whole & set(shared), "a card both held whole and shared"
    assert all(mb <= cards[u][1]["memory_mib"] for u, mb in shared.items()), "a card over-shared"
    assert all(mb <= by_node[n]["memory_mb"] for n, mb in ram.items()), "a node's RAM over-claimed"
    return len(whole) + len(shared)


def check_stable(first, second, needs, gone, sick):
    """Assert that the incremental pass moved exactly the replicas on the gone node or sick cards."""
    wanted = {r for n in needs for r in placement.replica_names(n.model, n.replicas)}
    hit = {r for r, c in first.claims.items()
           if r in wanted and (c["node"] == gone or any((c["node"], u) in sick for u in c["gpus"]))}
    assert set(second.moved) == hit, (sorted(second.moved), sorted(hit))
    for r, c in first.claims.items():
        if r in wanted and r not in hit:
            assert second.claims[r]["gpus"] == c["gpus"] and second.claims[r]["node"] == c["node"], r
    return len(hit)


# --- measuring ------------------------------------------------------------------------------
def timed(fn, runs):
    """Return ((wall, CPU) seconds of each run, the last result); the collector runs before each.

    CPU time is this process's own: on a shared machine it moves less than wall time does.
    """
    times, out = [], None
    for _ in range(runs):
        gc.collect()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times, out


def digest(result):
    """Return a short hash of everything a pass decides: claims, moves and verdicts."""
    body = json.dumps([result.claims, result.moved, result.verdicts], sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def tally(nodes, result):
    """Return (replicas wanted, placed, models not fully placed, healthy cards)."""
    verdicts = result.verdicts.values()
    healthy = sum(1 for n in nodes for g in n["gpus"] if g["healthy"])
    return (sum(v["wanted"] for v in verdicts), sum(v["placed"] for v in verdicts),
            sum(1 for v in verdicts if v["placed"] < v["wanted"]), healthy)


def explainable(result, needs):
    """Return the models to explain: one not fully placed, and the most-placed many-card one."""
    short = [n for n in needs if result.verdicts[n.model]["placed"] < n.replicas]
    big = max(needs, key=lambda n: (n.gpus * result.verdicts[n.model]["placed"], n.model))
    return ([("a model short", short[0])] if short else []) + [("a placed GPU model", big)]


def ms(times):
    """Return 'min / median / max' wall ms, then the median CPU ms."""
    wall = [w for w, _ in times]
    spread = " / ".join(f"{t * 1000:,.1f}" for t in (min(wall), statistics.median(wall), max(wall)))
    return f"{spread} | {statistics.median(c for _, c in times) * 1000:,.1f}"


def dump(path, full, inc):
    """Write both passes' claims, moves and verdicts as JSON, to diff two planner versions."""
    body = {name: {"claims": r.claims, "moved": r.moved, "verdicts": r.verdicts}
            for name, r in (("full", full), ("incremental", inc))}
    Path(path).write_text(json.dumps(body, sort_keys=True, indent=1, default=str))


def profile(fn, top):
    """Print the cProfile of one call of fn, by internal time."""
    prof = cProfile.Profile()
    prof.runcall(fn)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def build(node_count, model_count):
    """Return (specs, needs, node facts) of the fleet and models, and print what they are."""
    rng = random.Random(20261129)  # fixed: every run builds the same fleet and models
    t0 = time.perf_counter()
    specs, needs = fleet(rng, node_count), models(rng, model_count)
    nodes = [node_facts(s) for s in specs]
    built = time.perf_counter() - t0
    kinds = Counter(s["kind"] for s in specs)
    installing = sum(any(s != "ready" for s, _ in n["installs"].values()) for n in nodes)
    print(f"fleet: {len(nodes)} nodes ({kinds['h100']} 8×H100, {kinds['l4']} 4×L4, {kinds['cpu']} CPU), "
          f"{sum(len(n['gpus']) for n in nodes)} cards, {sum(not n['reachable'] for n in nodes)} "
          f"unreachable, {installing} installing; {len(needs)} models; built and parsed in "
          f"{built * 1000:.0f} ms")
    return rng, specs, needs, nodes


def row(name, runs, times, nodes, needs, result, moved=None):
    """Print one table row of a placement pass, after checking its invariants."""
    claimed = check(nodes, needs, result)
    wanted, placed, short, healthy = tally(nodes, result)
    moves = "" if moved is None else f" ({moved} moved)"
    print(f"| {name} | {runs} | {ms(times)} | {wanted:,} → {placed:,}{moves} | {short} | "
          f"{claimed:,} / {healthy:,} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--models", type=int, default=500)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one full pass")
    ap.add_argument("--dump", metavar="FILE", help="write both passes' output as JSON")
    a = ap.parse_args()
    rng, specs, needs, nodes = build(a.nodes, a.models)

    full_t, full = timed(lambda: placement.place(nodes, needs, []), a.runs)
    specs2, needs2, gone, sick = changed(rng, specs, needs, full)
    nodes2, claims = [node_facts(s) for s in specs2], fed_back(full)
    inc_t, inc = timed(lambda: placement.place(nodes2, needs2, claims), a.runs)
    explained = [(what, n, *timed(lambda n=n: placement.node_lines(full, n), a.runs * 4))
                 for what, n in explainable(full, needs)]

    print("\n| pass | runs | wall min / median / max (ms) | CPU median (ms) | replicas wanted → placed "
          "| models short | cards claimed / healthy |\n|---|---|---|---|---|---|---|")
    row("full, no claims", a.runs, full_t, nodes, needs, full)
    row("incremental", a.runs, inc_t, nodes2, needs2, inc, check_stable(full, inc, needs2, gone, sick))
    for what, n, times, lines in explained:
        print(f"| explain {what} | {a.runs * 4} | {ms(times)} | {len(lines):,} node lines for "
              f"{n.model} | | |")
    print(f"\nincremental change: node {gone} gone, 3 cards unhealthy, 10 models +1 replica")
    for _, n, _, _ in explained:
        print(f"explained: {n.model}: {full.verdicts[n.model]['summary'][:150]}")
    print(f"digest: full {digest(full)}, incremental {digest(inc)}")
    print("invariants: ok (no card held twice, shares fit, healthy cards only, labels, classes, "
          "RAM, max per node; only the hit replicas moved)")
    verdict(full_t, (a.nodes, a.models) == (1000, 500))
    if a.dump:
        dump(a.dump, full, inc)
    if a.profile:
        profile(lambda: placement.place(nodes, needs, []), 25)


def verdict(times, at_target_size):
    """Print PASS or FAIL for the full pass's median wall time against the target."""
    median = statistics.median(w for w, _ in times)
    word = "PASS" if median <= TARGET_S else "FAIL"
    size = "" if at_target_size else " (the target is set for 1,000 nodes and 500 models)"
    print(f"{word}: full pass median {median:.3f} s wall, target ≤ {TARGET_S:.0f} s{size}")


if __name__ == "__main__":
    main()
