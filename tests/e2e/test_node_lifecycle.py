"""Nodes coming and going under load: drain, a node whose network is cut, a scale-down.

Three sshd nodes (a runs systemd as PID 1, b and c the setsid fallback) serve one model on the
simulated engine; a client sends chat requests through the gateway the whole time, several at
once, half of them streamed, and every failure is counted with what it said.
"""
import json
import re
import threading
import time

import pytest
import requests

from tests.conftest import free_port
from tests.e2e.conftest import (ControlPlane, cli, configure, need_test_nodes, nodes_json,
                                operator_key, tune, wait_for)
from tests.e2e.test_gpu_placement import events, page
from tests.harness import nodes as harness
from tests.harness.engine_keys import engine_auth
from tests.test_local_cluster import stream_in_thread

pytestmark = pytest.mark.e2e
SUBNET = "10.250.12"
LOST_AFTER = 8


class Traffic:
    """Chat requests through the gateway from `workers` threads until stopped; half streamed."""

    def __init__(self, url, key, workers=4):
        self.url, self.key, self.workers = url, key, workers
        self.results = []  # (started, ended, ok, what went wrong)
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(workers)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        for t in self.threads:
            t.join(120)

    def _loop(self, worker):
        n = 0
        while not self.stopped.is_set():
            n += 1
            started = time.monotonic()
            ok, why = self._one(streamed=(n + worker) % 2 == 0)
            self.results.append((started, time.monotonic(), ok, why))

    def _one(self, streamed):
        try:
            r = requests.post(self.url + "/v1/chat/completions", stream=streamed, timeout=120,
                              headers={"Authorization": f"Bearer {self.key}"},
                              json={"model": "demo", "max_tokens": 20, "stream": streamed,
                                    "messages": [{"role": "user", "content": "hello 世界 🙂"}]})
            body = r.content.decode()
        except requests.RequestException as e:
            return False, f"client: {e}"
        if r.status_code != 200:
            return False, f"{r.status_code}: {body[:300]}"
        if streamed:
            done = body.rstrip().endswith("data: [DONE]") and '"error"' not in body
            return done, "" if done else f"stream: {body[-600:]}"
        return ("choices" in json.loads(body)), body[:300]

    def count(self, ok=True):
        return sum(1 for r in list(self.results) if r[2] == ok)

    def failures(self):
        return [r for r in list(self.results) if not r[2]]


@pytest.fixture(scope="module")
def life(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub

    work = tmp_path_factory.mktemp("life")
    operator, pub = operator_key(work)
    env = {"work": work}
    with FakeGitHub() as github, \
            harness.NodeCluster(work / "nodes", [pub], subnet_prefix=SUBNET) as fleet:
        booted = [fleet.add("a", systemd=True, wait=False), fleet.add("b", wait=False),
                  fleet.add("c", wait=False)]
        for node in booted:
            node.wait_ready(60)
            env[node.name] = node
        root = env["root"] = work / "cp"
        init = cli(root, "init", "--admin", "ops@example.com")
        env["password"] = re.search(r"password: (\S+)", init.stdout).group(1)
        plane = env["plane"] = ControlPlane(root, free_port())
        configure(root, github, listen=f"127.0.0.1:{plane.port}", llamacpp="")
        tune(root, "reconciler", node_lost_after=LOST_AFTER)
        for node in booted:
            cli(root, "add-node", node.name, "--addr", node.ip, "--bootstrap-key", str(operator))
        cli(root, "model", "add", "demo", "--engine", "sim", "--replicas", "3",
            "--arg=--token-delay", "--arg=0.02")
        env["key"] = cli(root, "keys", "create", "--project", "default").stdout.strip()
        plane.start()
        try:
            wait_for("a replica on each node", lambda: placed(root) == {"a": 1, "b": 1, "c": 1},
                     timeout=180)
            yield env
        finally:
            plane.stop()


def replicas(root):
    return [dict(r, node=name) for name, n in nodes_json(root).items() for r in n["replicas"]]


def placed(root):
    """{node: ready replicas there}."""
    out = {}
    for r in replicas(root):
        if r["state"] == "ready":
            out[r["node"]] = out.get(r["node"], 0) + 1
    return out


def our_units(node):
    """The llmgw engine units systemd on the node knows of, in any state."""
    out = node.exec(["systemctl", "list-units", "--all", "--plain", "--no-legend", "llmgw-demo*"])
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def five_second_stream(root, endpoint, model):
    """250 tokens at the engine's 0.02 s, read straight from it (with its key) in a thread."""
    return stream_in_thread(endpoint, model, 250, engine_auth(root, endpoint))


def answers(endpoint):
    try:
        return requests.get(endpoint + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def test_a_drain_moves_every_replica_first_and_fails_no_request(life):
    root, a = life["root"], life["a"]
    before = [r["endpoint"] for r in replicas(root) if r["node"] == "a"]
    with Traffic(life["plane"].url, life["key"]) as traffic:
        wait_for("traffic to flow", lambda: traffic.count() >= 20, timeout=60, every=0.2)
        out = cli(root, "drain", "a", "--timeout", "60s").stdout
        assert "a draining: its 1 replica(s) start on other nodes first" in out
        wait_for("a to be drained", lambda: nodes_json(root)["a"]["state"] == "drained", timeout=120)
        done = traffic.count()
        wait_for("traffic after the drain", lambda: traffic.count() >= done + 20, timeout=60,
                 every=0.2)
    print(f"drain: {len(traffic.results)} requests, {len(traffic.failures())} failed")
    assert traffic.failures() == []
    assert our_units(a) == [] and not any(answers(e) for e in before)
    assert placed(root) in ({"b": 2, "c": 1}, {"b": 1, "c": 2})
    names = sorted(r["name"] for r in replicas(root))
    assert len(names) == 3 and any(n.endswith("-g1") for n in names)
    # Back from maintenance: it takes the next replica.
    assert "a uncordoned by the CLI (it was drained)" in cli(root, "uncordon", "a").stdout
    cli(root, "model", "set", "demo", "--replicas", "4")
    wait_for("a fourth replica on a", lambda: placed(root).get("a") == 1, timeout=120)


def test_a_stream_on_the_replica_scaled_away_ends_with_done(life):
    root = life["root"]
    wait_for("four ready replicas", lambda: sum(placed(root).values()) == 4, timeout=120)
    leaving = next(r for r in replicas(root) if r["name"] == "demo-3")
    reader, got = five_second_stream(root, leaving["endpoint"], "demo")
    cli(root, "model", "set", "demo", "--replicas", "3")
    reader.join(60)
    assert got["body"].rstrip().endswith("data: [DONE]")
    assert got["body"].count("data: ") == 250 + 3
    wait_for("demo-3 gone", lambda: "demo-3" not in {r["name"] for r in replicas(root)}, timeout=60)
    assert not answers(leaving["endpoint"])


def test_a_node_whose_network_is_cut_is_lost_its_replicas_move_and_its_stale_engines_stop(life):
    root, b = life["root"], life["b"]
    on_b = [r for r in replicas(root) if r["node"] == "b"]
    assert on_b, replicas(root)
    seen = {name: nodes_json(root)[name]["last_seen"] for name in ("a", "c")}
    with Traffic(life["plane"].url, life["key"]) as traffic:
        wait_for("traffic to flow", lambda: traffic.count() >= 20, timeout=60, every=0.2)
        cut = time.monotonic()
        b.set_network(False)  # packets vanish: nothing is refused, everything waits
        try:
            # The other nodes' passes keep their pace: each is seen again several times.
            for _ in range(3):
                for name in ("a", "c"):
                    wait_for(f"{name} seen again", lambda: nodes_json(root)[name]["last_seen"] != seen[name],
                             timeout=15, every=0.5)
                    seen[name] = nodes_json(root)[name]["last_seen"]
            wait_for("b to be lost", lambda: nodes_json(root)["b"]["state"] == "lost", timeout=120)
            wait_for("three ready replicas off b",
                     lambda: sum(n for name, n in placed(root).items() if name != "b") == 3, timeout=120)
            done = traffic.count()
            wait_for("traffic after the move", lambda: traffic.count() >= done + 20, timeout=60,
                     every=0.2)
        finally:
            b.set_network(True)
    failed = traffic.failures()
    longest = max(end - start for start, end, _, _ in traffic.results)
    print(f"network cut: {len(traffic.results)} requests, {len(failed)} failed "
          f"({[why[:120] for *_, why in failed]}); the longest took {longest:.1f} s")
    # Only requests already under way on b when its link went silent may fail, and they end
    # within the liveness bound, not TCP's own quarter of an hour.
    assert all(start < cut for start, *_ in failed), [(start - cut, why) for start, _, _, why in failed]
    assert longest < 60
    wait_for("b back and its stale engines stopped",
             lambda: nodes_json(root)["b"]["state"] == "ready", timeout=120)
    assert not any(answers(r["endpoint"]) for r in on_b)
    rows = replicas(root)
    assert sorted(r["name"].split("-g")[0] for r in rows) == ["demo-0", "demo-1", "demo-2"]
    assert all(r["state"] == "ready" for r in rows) and not [r for r in rows if r["node"] == "b"]
    history = events(page(life, "/nodes/b"))
    assert any(e.startswith(f"lost: neither SSH nor its engines answered for {LOST_AFTER} s") for e in history)
    back = next(e for e in history if e.startswith("back after being lost since "))
    assert all(f"llmgw-{r['name']}" in back for r in on_b), back


def test_a_stream_on_a_removed_model_ends_with_done(life):
    root = life["root"]
    cli(root, "model", "add", "extra", "--engine", "sim", "--arg=--token-delay", "--arg=0.02")
    wait_for("extra ready", lambda: any(r["name"] == "extra-0" and r["state"] == "ready"
                                        for r in replicas(root)), timeout=120)
    leaving = next(r for r in replicas(root) if r["name"] == "extra-0")
    reader, got = five_second_stream(root, leaving["endpoint"], "extra")
    out = cli(root, "model", "remove", "extra")
    reader.join(60)
    assert "extra: 1 replica(s) out of routing, finishing their requests" in out.stderr
    assert "removed model extra" in out.stdout
    assert got["body"].rstrip().endswith("data: [DONE]") and got["body"].count("data: ") == 253
    assert not answers(leaving["endpoint"])
    assert "extra" not in {m["name"] for m in json.loads(cli(root, "models", "--json").stdout)}
