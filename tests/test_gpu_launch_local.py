"""Replicas start pinned to their claimed cards, and move when a card turns unhealthy.

This machine is the node (a local transport, the simulated engine) and `nvidia-smi` is a
script on PATH printing a recorded sample, which the test swaps for one with ECC errors. What
is checked is what reached the engine's process: its environment in /proc/PID/environ.
"""
import asyncio
import json
from pathlib import Path

import pytest

from llmgw.facts import gpu
from llmgw.models import Model, Node, NodeEvent, Replica, utcnow
from llmgw.services import nodes
from tests.conftest import free_port_range, reconcile

CASES = Path(__file__).parent / "cases" / "gpus"
FAKE_SMI = '#!/bin/sh\ncat "{sample}"\n'


def environ(node_dir, replica):
    pid = (Path(node_dir) / "run" / f"llmgw-{replica}.pid").read_text().strip()
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.fixture
def gpu_node(app, tmp_path, monkeypatch):
    """A local node whose nvidia-smi prints the 8×H100 sample; yields (conf, node dir, sample path)."""
    sample = tmp_path / "nvidia-smi.out"
    text = json.loads((CASES / "h100x8-one-ecc.json").read_text())["output"]
    sample.write_text(text)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").write_text(FAKE_SMI.format(sample=sample))
    (bindir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    conf = app.config["LLMGW"]
    conf["engines"]["llamacpp"] = ""
    conf["reconciler"]["gpu_check_interval"] = 0
    base = free_port_range(50)
    conf["reconciler"]["port_range"] = f"{base}-{base + 50}"
    node_dir = tmp_path / "node"
    node = asyncio.run(nodes.add_local_node("local", str(node_dir)))
    # Discovery looks for a loaded driver before it asks nvidia-smi; here the cards come from
    # the sample directly, and every pass asks the fake nvidia-smi again.
    Node.update(facts=dict(node.facts, gpus=gpu.parse_gpus(text)), discovered=utcnow()) \
        .where(Node.id == node.id).execute()
    yield conf, node_dir, sample
    from llmgw.executors.transport import LocalTransport
    from llmgw.plans import launch
    from llmgw.services.replicas import running_units
    t = LocalTransport()
    for unit in asyncio.run(running_units(t, "setsid", str(node_dir))):
        asyncio.run(t.run(launch.stop_argv("setsid", f"llmgw-{unit}", str(node_dir))))


def ready(name):
    return lambda: Replica.select().where(Replica.name == name, Replica.state == "ready").exists()


def test_a_replica_gets_its_cards_in_its_environment_and_moves_off_a_sick_one(gpu_node):
    conf, node_dir, sample = gpu_node
    uuids = [g["uuid"] for g in gpu.parse_gpus(sample.read_text())]
    Model.create(name="pair", engine="sim", source="", replicas=1, gpus=2, gpu_classes=["h100-80g"],
                 args=["--token-delay", "0"])
    Model.create(name="cpu", engine="sim", source="", replicas=1, args=["--token-delay", "0"])
    reconcile(conf, until=lambda: ready("pair-0")() and ready("cpu-0")())
    pair = Replica.get(Replica.name == "pair-0")
    assert (pair.gpu_indexes, pair.gpu_uuids) == ([0, 1], uuids[:2])
    env = environ(node_dir, "pair-0")
    assert env["CUDA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[1]}"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert environ(node_dir, "cpu-0")["CUDA_VISIBLE_DEVICES"] == ""  # a CPU replica sees no card

    # GPU 1 starts counting uncorrected ECC errors: the replica leaves it for healthy cards.
    lines = sample.read_text().splitlines()
    lines[1] = lines[1].rsplit(",", 1)[0] + ", 5"
    sample.write_text("\n".join(lines) + "\n")
    reconcile(conf, until=lambda: ready("pair-0")() and
              Replica.get(Replica.name == "pair-0").gpu_indexes == [0, 2])
    env = environ(node_dir, "pair-0")
    assert env["CUDA_VISIBLE_DEVICES"] == f"{uuids[0]},{uuids[2]}"
    said = [e.text for e in NodeEvent.select().order_by(NodeEvent.id)]
    assert any(t.startswith(f"GPU 1 ({uuids[1]}) became unhealthy: 5 uncorrected ECC errors") for t in said), said
    assert any(t.startswith(f"stopped pair-0: GPU 1 ({uuids[1]}) on local is unhealthy: 5 uncorrected")
               and t.endswith("placed again on GPU 0, 2") for t in said), said


def test_fewer_replicas_free_their_cards(gpu_node):
    conf, node_dir, sample = gpu_node
    Model.create(name="one", engine="sim", source="", replicas=3, gpus=1, args=["--token-delay", "0"])
    reconcile(conf, until=lambda: all(ready(f"one-{i}")() for i in range(3)))
    held = sorted(i for r in Replica.select() for i in r.gpu_indexes)
    assert held == [0, 1, 2]
    Model.update(replicas=1).where(Model.name == "one").execute()
    reconcile(conf, until=lambda: Replica.select().count() == 1)
    assert [r.gpu_indexes for r in Replica.select()] == [[0]]
