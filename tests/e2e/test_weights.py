"""Weights on a real fleet: a directory model copied to two nodes as a checked tree, its copy
surviving a killed reconciler, its progress on the node page; weights used in place with
--node-path; unused weights collected.

Two sshd nodes with fake GPUs (recorded nvidia-smi samples) and a stand-in vLLM that records
how it was started and serves with llmgw's simulated engine. Copies are capped at
weights.max_rate so that they last long enough to be watched and interrupted.
"""
import hashlib
import json
import os
import re
import signal
import struct

import pytest

from tests.conftest import TOP, free_port
from tests.e2e.conftest import (ControlPlane, cli, configure, need_test_nodes, operator_key, tune,
                                wait_for)
from tests.e2e.test_gpu_placement import (VLLM, VLLM_SHIM, admin_session, events, fake_gpus,
                                          replicas_of, sample, wait_ready)
from tests.e2e.test_serve_supervision import reconciler_child
from tests.harness import browser
from tests.harness import nodes as harness

pytestmark = pytest.mark.e2e
SUBNET = "10.250.14"
ADMIN = "ops@example.com"
SHARD = 16 * 2**20  # two of them: 32 MiB a copy, about 16 s at weights.max_rate = 2M
BASE = "/opt/llmgw"
CONFIGS = TOP / "tests" / "cases" / "model_configs"


def write_model_dir(path, shard_bytes, seed):
    """A real model's config.json, a tokenizer and two safetensors shards of random F16 weights."""
    path.mkdir(parents=True)
    (path / "config.json").write_text((CONFIGS / "qwen2.5-7b-instruct.json").read_text())
    (path / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {"a": 0}}}))
    for i in (1, 2):
        header = json.dumps({"w": {"dtype": "F16", "shape": [shard_bytes // 2],
                                   "data_offsets": [0, shard_bytes]}}).encode()
        with open(path / f"model-0000{i}-of-00002.safetensors", "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            f.write(os.urandom(shard_bytes) if seed else b"\0" * shard_bytes)
    return path


def local_hashes(path):
    return {p.relative_to(path).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in path.rglob("*") if p.is_file()}


def node_hashes(node, directory):
    out = node.exec(["sh", "-c", 'cd "$0" && find . -type f ! -name .llmgw-manifest | sort | '
                                 'xargs sha256sum', directory]).stdout
    return {name[2:]: digest for digest, name in (line.split("  ", 1) for line in out.splitlines())}


@pytest.fixture(scope="module")
def wfleet(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub

    work = tmp_path_factory.mktemp("weights")
    operator, pub = operator_key(work)
    env = {"work": work}
    with FakeGitHub() as github, \
            harness.NodeCluster(work / "nodes", [pub], subnet_prefix=SUBNET) as cluster:
        booted = [cluster.add("w1", systemd=True, wait=False), cluster.add("w2", wait=False)]
        for node in booted:
            node.wait_ready(60)
            env[node.name] = node
            node.write_file(VLLM, VLLM_SHIM, mode=0o755)
            node.write_file("/opt/vllm/sim_engine.py",
                            (TOP / "llmgw" / "scripts" / "sim_engine.py").read_text())
        fake_gpus(env["w1"], sample("l4x4.json"))
        fake_gpus(env["w2"], sample("h100x8-one-ecc.json"))
        root = env["root"] = work / "cp"
        init = cli(root, "init", "--admin", ADMIN)
        env["password"] = re.search(r"password: (\S+)", init.stdout).group(1)
        plane = env["plane"] = ControlPlane(root, free_port())
        configure(root, github, listen=f"127.0.0.1:{plane.port}", llamacpp="")
        tune(root, "weights", max_rate="2M", keep_unused="3s")
        with open(root / "server.toml", "a") as toml:
            for node in booted:
                toml.write(f'\n[node_engines.{node.name}]\nvllm = "{VLLM}"\n')
        for node in booted:
            cli(root, "add-node", node.name, "--addr", node.ip, "--bootstrap-key", str(operator))
        env["key"] = cli(root, "keys", "create", "--project", "default").stdout.strip()
        env["vl"] = write_model_dir(work / "vl", SHARD, seed=1)
        env["small"] = write_model_dir(work / "small", 4096, seed=0)
        plane.start()
        try:
            yield env
        finally:
            plane.stop()


def progress(root, model, node):
    rows = [r for r in replicas_of(root, model) if r["node"] == node]
    return (rows[0].get("progress") or {}) if rows else {}


def test_a_directory_reaches_two_nodes_and_its_copy_survives_a_killed_reconciler(wfleet):
    root, plane = wfleet["root"], wfleet["plane"]
    out = cli(root, "model", "add", "vl", "--engine", "vllm", "--file", str(wfleet["vl"]),
              "--gpus", "1", "--replicas", "2", "--max-per-node", "1")
    assert "added model vl" in out.stdout
    total = sum(p.stat().st_size for p in wfleet["vl"].rglob("*") if p.is_file())
    wait_for("w1's copy a quarter done", lambda: progress(root, "vl", "w1").get("done", 0) > total // 4,
             timeout=120, every=0.2)
    killed = reconciler_child(plane.proc.pid)
    os.kill(killed, signal.SIGKILL)  # mid-copy: the .partial tree stays on the nodes
    at_kill = progress(root, "vl", "w1")["done"]
    wait_for("a new reconciler", lambda: (reconciler_child(plane.proc.pid) or killed) != killed,
             timeout=60, every=0.2)
    # Watched in a browser on the other node's page: the bar rises as the table refreshes.
    reason = browser.missing_reason()
    seen = []
    if not reason:
        watch_progress(wfleet, seen)
    rows = wait_ready(root, "vl", 2, timeout=180)
    sha = json.loads(cli(root, "model", "show", "vl", "--json").stdout)["sha256"]
    for node_name in ("w1", "w2"):
        node = wfleet[node_name]
        tree = f"{BASE}/models/vl-{sha[:12]}"
        assert node_hashes(node, tree) == local_hashes(wfleet["vl"])
        argv = node.read_file(f"/var/lib/vllm-shim/{next(r for r in rows if r['node'] == node_name)['port']}.argv")
        assert argv.splitlines()[:2] == ["serve", tree]
    said = events(admin_session(wfleet).get(plane.url + "/nodes/w1").text)
    copied = next(e for e in said if "vl's weights copied" in e)
    m = re.search(r"copied, ([\d.]+) MB sent after resuming at ([\d.]+) MB", copied)
    assert m, copied
    sent, resumed = float(m.group(1)) * 10**6, float(m.group(2)) * 10**6
    # Not from zero: what the killed reconciler had copied stayed, and only the rest was sent.
    assert resumed > total // 8 and sent < total - total // 8, (copied, at_kill, total)
    print(f"w1: {total} bytes, killed at {at_kill}, resumed at {resumed:.0f}, sent {sent:.0f} after")
    if reason:
        pytest.skip(f"the copy was not watched in a browser: {reason}")


def watch_progress(wfleet, seen):
    """Log in with headless Chromium and watch w2's replica table until the bar has risen."""
    plane = wfleet["plane"]
    b = browser.Browser()
    try:
        b.get(plane.url + "/login")
        b.type("input[name=email]", ADMIN)
        b.type("input[name=password]", wfleet["password"])
        b.click("button[type=submit]")
        # Logged in once the cluster page shows: leaving earlier can cancel the login's POST.
        b.wait_for_text("w2", css="#cluster")
        b.get(plane.url + "/nodes/w2")
        texts = []

        def rising():
            try:
                text = b.text("#node-replicas")
            except RuntimeError:
                return False
            texts.append(text)
            m = re.search(r"\((\d+)%\)", text)
            if m and (not seen or int(m.group(1)) > seen[-1]):
                seen.append(int(m.group(1)))
            return len(seen) >= 2
        try:
            wait_for("the progress bar on w2's page to rise", rising, timeout=60, every=0.5)
        except AssertionError:
            raise AssertionError(f"seen {seen}; the table showed: {texts[-3:]}") from None
        b.screenshot(str(wfleet["work"] / "node-w2-copy.png"))
    finally:
        b.close()
    assert seen == sorted(seen) and seen[-1] > seen[0], seen


def test_weights_on_the_nodes_are_used_in_place_and_a_node_without_them_is_refused(wfleet):
    root, w1 = wfleet["root"], wfleet["w1"]
    w1.write_file("/srv/vl-np/config.json", json.dumps({"architectures": ["LlamaForCausalLM"]}))
    cli(root, "model", "add", "vlnp", "--engine", "vllm", "--node-path", "/srv/vl-np", "--gpus", "1",
        "--replicas", "2", "--max-per-node", "1")
    wait_for("vlnp ready on w1 and refused on w2", lambda: {
        r["node"]: r["state"] for r in replicas_of(root, "vlnp")}.get("w1") == "ready" and any(
        r["node"] == "w2" and "/srv/vl-np is not a directory with config.json on w2" in r["detail"]
        for r in replicas_of(root, "vlnp")), timeout=120)
    row = next(r for r in replicas_of(root, "vlnp") if r["node"] == "w1")
    assert w1.read_file(f"/var/lib/vllm-shim/{row['port']}.argv").splitlines()[:2] == ["serve", "/srv/vl-np"]
    listing = w1.exec(["ls", f"{BASE}/models"]).stdout.split()
    assert not [n for n in listing if n.startswith("vlnp")], listing  # nothing copied
    bad = cli(root, "model", "add", "rel", "--engine", "vllm", "--node-path", "srv/x", "--gpus", "1",
              check=False)
    assert bad.returncode != 0 and "--node-path must be an absolute path on the nodes, not 'srv/x'" in bad.stderr
    up = cli(root, "model", "add", "up", "--engine", "vllm", "--node-path", "/srv/../etc", "--gpus", "1",
             check=False)
    assert up.returncode != 0 and "climbs out with '..'" in up.stderr
    cli(root, "model", "remove", "vlnp")


def test_unused_weights_are_collected_and_those_in_use_and_beside_models_stay(wfleet):
    root, w1 = wfleet["root"], wfleet["w1"]
    cli(root, "model", "add", "small", "--engine", "vllm", "--file", str(wfleet["small"]),
        "--gpus", "1", "--max-per-node", "1")
    wait_ready(root, "small", 1, timeout=120)
    small_node = wfleet[replicas_of(root, "small")[0]["node"]]
    w1.write_file(f"{BASE}/keep-me.bin", "planted beside <base>/models")
    sha = json.loads(cli(root, "model", "show", "vl", "--json").stdout)["sha256"]
    cli(root, "model", "remove", "vl")
    for node in (wfleet["w1"], wfleet["w2"]):
        wait_for(f"vl's tree collected on {node.name}",
                 lambda: f"vl-{sha[:12]}" not in node.exec(["ls", f"{BASE}/models"]).stdout, timeout=60)
    kept = small_node.exec(["ls", f"{BASE}/models"]).stdout.split()
    assert [n for n in kept if n.startswith("small-")], kept
    assert w1.read_file(f"{BASE}/keep-me.bin") == "planted beside <base>/models"
    said = events(admin_session(wfleet).get(wfleet["plane"].url + "/nodes/w1").text)
    assert any(e.startswith(f"collected vl-{sha[:12]} (") for e in said), said[:5]
    listed = json.loads(cli(root, "weights", small_node.name, "--json").stdout)
    mine = next(r for r in listed if r["name"].startswith("small-"))
    assert mine["in_use_by"] and not mine["collectable"]
