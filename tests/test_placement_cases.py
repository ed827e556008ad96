"""The placement planner against the cases in tests/cases/placement/*.json.

Each case is a fleet (nodes whose GPUs come from the recorded nvidia-smi samples in
tests/cases/gpus/), the models' needs and the claims already recorded; out come the claims
(node and card indexes), the replicas that must move and why, each model's summary and
every node's verdict sentence. The files are the specification: read them first.
"""
import json
from pathlib import Path

import pytest

from llmgw.facts import gpu
from llmgw.plans import placement
from llmgw.plans.fleet import Need

CASES = Path(__file__).parent / "cases"


def sample(name):
    return gpu.parse_gpus(json.loads((CASES / "gpus" / f"{name}.json").read_text())["output"])


def node_facts(spec):
    gpus = spec.get("gpus", [])
    gpus = sample(gpus) if isinstance(gpus, str) else gpus
    for index, reason in spec.get("unhealthy", {}).items():
        card = next(g for g in gpus if g["index"] == int(index))
        card.update(healthy=False, reason=reason)
    installs = {e: (s, "") if isinstance(s, str) else tuple(s)
                for e, s in spec.get("installs", {"llamacpp": "ready"}).items()}
    return {"name": spec["name"], "reachable": spec.get("reachable", True), "installs": installs,
            "state": spec.get("state", "ready"), "lost": spec.get("lost", False),
            "labels": spec.get("labels", {}), "memory_mb": spec.get("memory_mb", 1048576),
            "gpus": gpus}


def need(spec):
    spec = dict(spec)
    spec["classes"] = tuple(spec.get("classes", ()))
    spec["requires"] = tuple(sorted(spec.get("requires", {}).items()))
    spec.setdefault("engine", "llamacpp")
    return Need(**spec)


def claims_in(case, facts):
    uuids = {(f["name"], g["index"]): g["uuid"] for f in facts for g in f["gpus"]}
    out = []
    for c in case.get("claims", []):
        out.append({"replica": c["replica"], "model": c["model"], "node": c["node"],
                    "gpus": [uuids[(c["node"], i)] for i in c.get("indexes", [])],
                    "gpu_memory_mb": c.get("gpu_memory_mb", 0), "memory_mb": c.get("memory_mb", 0),
                    "leaving": c.get("leaving", False)})
    return out


def run(case):
    facts = [node_facts(n) for n in case["nodes"]]
    needs = [need(m) for m in case["models"]]
    return placement.place(facts, needs, claims_in(case, facts)), needs


def outcome(case):
    result, needs = run(case)
    got = {"claims": {r: {"node": c["node"], "indexes": c["indexes"]}
                      | ({"gpu_memory_mb": c["gpu_memory_mb"]} if c["gpu_memory_mb"] else {})
                      for r, c in sorted(result.claims.items())},
           "moved": result.moved, "replaced": result.replaced,
           "summary": {m: v["summary"] for m, v in result.verdicts.items()},
           "lines": {n.model: {line["node"]: line["reason"] for line in placement.node_lines(result, n)}
                     for n in needs}}
    return {k: got[k] for k in case["expected"]}


def all_cases():
    for path in sorted((CASES / "placement").glob("*.json")):
        yield pytest.param(path, id=path.stem)


@pytest.mark.parametrize("path", list(all_cases()))
def test_placement_case(path):
    case = json.loads(path.read_text())
    expected = case["expected"]
    if "lines" in expected:  # a case may name only the nodes whose sentence it is about
        got = outcome(case)
        got["lines"] = {m: {n: r for n, r in lines.items() if n in expected["lines"].get(m, {})}
                        for m, lines in got["lines"].items() if m in expected["lines"]}
        assert got == expected
    else:
        assert outcome(case) == expected


@pytest.mark.parametrize("path", list(all_cases()))
def test_placement_is_deterministic_and_stable(path):
    """The same facts give the same claims, and feeding a result back in moves nothing."""
    case = json.loads(path.read_text())
    first, needs = run(case)
    again, _ = run(case)
    assert first.claims == again.claims
    facts = [node_facts(n) for n in case["nodes"]]
    fed_back = [dict(c, replica=r) for r, c in first.claims.items()]
    second = placement.place(facts, needs, fed_back)
    assert {r: c["gpus"] for r, c in second.claims.items()} == \
        {r: c["gpus"] for r, c in first.claims.items()}
    assert second.moved == {}


def test_there_are_cases_for_every_kind_of_decision():
    names = {p.stem for p in (CASES / "placement").glob("*.json")}
    for word in ("class", "count", "card-memory", "unhealthy", "label", "ram", "share", "spread",
                 "stable", "moves", "installing", "balance", "cordon", "drain", "lost"):
        assert any(word in n for n in names), f"no placement case about {word}"
