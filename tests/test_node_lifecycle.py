"""Drain, lost nodes and their return, on this machine: local nodes, the simulated engine.

A node SSH cannot reach is a row pointing at a loopback port nothing listens on; its engine,
when it has one, is a real simulated engine process answering over HTTP.
"""
import asyncio
import datetime
import json
import time

import pytest
import requests

from llmgw.executors.transport import LocalTransport
from llmgw.models import Model, Node, NodeEvent, Replica, utcnow
from llmgw.plans import launch
from llmgw.services import nodes
from llmgw.services.replicas import running_units
from tests.conftest import free_port, reconcile
from tests.test_local_cluster import engine_headers, stream_from
from tests.test_model_catalog import cli  # noqa: F401  (fixture)


def units(node):
    return asyncio.run(running_units(LocalTransport(), "setsid", node.base_dir))


@pytest.fixture
def second_node(tmp_path):
    """Add another local node; its engines are stopped after the test like the first one's."""
    made = []

    def make(name="local-b"):
        made.append(asyncio.run(nodes.add_local_node(name, str(tmp_path / name))))
        return made[-1]
    yield make
    for node in made:
        for unit in units(node):
            asyncio.run(LocalTransport().run(launch.stop_argv("setsid", f"llmgw-{unit}", node.base_dir)))


def rows():
    return {r.name: (r.node.name, r.state) for r in Replica.select().order_by(Replica.name)}


def said(node):
    return [e.text for e in NodeEvent.select().where(NodeEvent.node == node).order_by(NodeEvent.id)]


def test_a_drain_starts_the_replacement_first_and_lets_the_old_stream_finish(local_sim, second_node, cli):
    env = local_sim("0.1")
    conf, a = env["conf"], env["node"]
    reconcile(conf, lambda: rows() == {"demo-0": ("local", "ready")})
    b = second_node()
    reader, got = stream_from(conf, Replica.get(Replica.name == "demo-0"))  # 5 s on the old engine
    out = cli("drain", "local", "--timeout", "60s")
    assert out.exit_code == 0 and "local draining: its 1 replica(s) start on other nodes first" in out.output
    # The replacement is placed (once local-b has the engine) while the old engine serves on.
    reconcile(conf, lambda: "demo-0-g1" in rows())
    assert rows()["demo-0"] == ("local", "draining")
    reconcile(conf, lambda: Node.get(Node.name == "local").state == "drained", timeout=60)
    reader.join(30)
    assert got["body"].rstrip().endswith("data: [DONE]")
    assert got["body"].count("data: ") == 50 + 3
    assert rows() == {"demo-0-g1": ("local-b", "ready")}
    assert units(a) == set() and units(b) == {"demo-0-g1"}
    history = said(a)
    assert history[-5].startswith("draining, asked by the CLI: 1 replica(s) start elsewhere first")
    # local-b was still installing the engine at first: the drain said so, then found it.
    assert history[-4] == "demo-0 draining: no other node can run it yet; it serves here until one can"
    assert history[-3] == "demo-0 draining: demo-0-g1 starts on local-b to replace it"
    assert history[-2] == ("stopped demo-0 (demo-0-g1 on local-b serves in its place); its requests done")
    assert history[-1].startswith("drained: every replica it ran serves elsewhere")
    assert (json_state(cli, "local"), json_state(cli, "local-b")) == ("drained", "ready")
    # Uncordoned, it takes replicas again: the next one goes to the emptier node.
    assert "local uncordoned by the CLI (it was drained)" in cli("uncordon", "local").output
    Model.update(replicas=2).where(Model.name == "demo").execute()
    reconcile(conf, lambda: sum(s == "ready" for _, s in rows().values()) == 2)
    assert rows() == {"demo-0-g1": ("local-b", "ready"), "demo-1": ("local", "ready")}


def test_draining_the_last_node_that_can_run_a_model_keeps_it_serving_and_says_why(local_sim, cli):
    env = local_sim("0.01")
    conf = env["conf"]
    reconcile(conf, lambda: rows() == {"demo-0": ("local", "ready")})
    cli("drain", "local")
    reconcile(conf)
    reconcile(conf)
    row = Replica.get()
    assert (row.name, row.state) == ("demo-0", "draining")
    assert row.detail.startswith("draining: local is being drained, but no other node can run it "
                                 "yet; serving until one can (no node can run it (local: being drained")
    resp = requests.post(row.endpoint + "/v1/chat/completions", headers=engine_headers(conf, row), json={
        "model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}, timeout=10)
    assert resp.status_code == 200
    assert Node.get(Node.name == "local").state == "draining"


def test_bad_drain_input_is_refused_by_name(local_sim, cli):
    local_sim("0.01")
    out = cli("drain", "nowhere")
    assert out.exit_code != 0 and "no node called 'nowhere' (nodes: local)" in out.output
    out = cli("drain", "local", "--timeout", "ten minutes")
    assert out.exit_code != 0 and "--timeout 'ten minutes' is not a duration; write e.g. 90s, 10m or 1h" \
        in out.output
    assert Node.get().state == "ready"


def far_node(model, endpoint="", slot="demo-0"):
    """A node SSH cannot reach (nothing listens on its port), seen last ten minutes ago."""
    node = Node.create(name="far", transport="ssh", addr="127.0.0.1", port=free_port(),
                       host_key="", reachable=True, facts={"uid": 0}, last_seen=utcnow()
                       - datetime.timedelta(minutes=10))
    Replica.create(name=slot, slot=slot, model=model, node=node, port=1, state="ready",
                   endpoint=endpoint)
    return node


def test_a_node_out_of_ssh_reach_whose_engine_answers_is_not_lost(local_sim, sim_engine, client, auth):
    env = local_sim("0.01")
    conf = env["conf"]
    conf["reconciler"]["node_lost_after"] = 4  # passes here take well under a second each
    Node.update(state="cordoned").where(Node.name == "local").execute()  # nothing placed here
    far = far_node(Model.get(), sim_engine)
    # One reconciler, watching past node_lost_after: the engine answering keeps the node from
    # being lost.
    start = time.monotonic()
    reconcile(conf, lambda: time.monotonic() - start > 6 and not Node.get(Node.name == "far").reachable)
    assert Node.get(Node.name == "far").lost_since is None
    assert rows() == {"demo-0": ("far", "ready")}
    auth.login(password=auth.password)
    page = client.get("/nodes/far").get_data(as_text=True)
    assert "Unreachable over SSH, but its engines answer over HTTP" in page
    assert far.replicas.count() == 1


def test_a_lost_node_s_replicas_run_elsewhere_and_its_stale_engines_stop_when_it_is_back(local_sim, cli):
    env = local_sim("0.01")
    conf, a = env["conf"], env["node"]
    conf["reconciler"]["node_lost_after"] = 1
    reconcile(conf, lambda: rows() == {"demo-0": ("local", "ready")})
    # A node that answers neither SSH nor HTTP: declared lost, its replica placed elsewhere.
    far = far_node(Model.get(), "http://127.0.0.1:1", slot="demo-1")
    Model.update(replicas=2).where(Model.name == "demo").execute()
    reconcile(conf, lambda: Node.get(Node.name == "far").lost_since is not None, timeout=30)
    reconcile(conf, lambda: rows().get("demo-1-g1", ("", ""))[1] == "ready")
    assert rows() == {"demo-0": ("local", "ready"), "demo-1": ("far", "lost"),
                      "demo-1-g1": ("local", "ready")}
    history = said(far)
    assert history[0].startswith("demo-1 unhealthy: http://127.0.0.1:1/health stopped answering")
    assert history[1].startswith("lost: neither SSH nor its engines answered for 1 s (last: ")
    assert history[2] == "demo-1 leaves: its node far is lost; demo-1-g1 placed on local"
    assert json_state(cli, "far") == "lost"
    # The local node plays a lost node coming back with a stale engine of a moved replica.
    Node.update(lost_since=utcnow()).where(Node.id == a.id).execute()
    reconcile(conf, lambda: Node.get(Node.id == a.id).lost_since is None)
    assert units(a) == set()  # every engine it ran was stopped: their replicas went elsewhere
    assert said(a)[-1].startswith("back after being lost since ")
    assert "stale engines stopped: llmgw-demo-0, llmgw-demo-1-g1; 2 replica row(s)" in said(a)[-1]
    # Nothing else can run them (far is lost): placed on local again, started afresh (the
    # names may repeat: nothing of the old engines is left to be adopted).
    reconcile(conf, lambda: sum(s == "ready" for _, s in rows().values()) == 2)
    assert rows() == {"demo-0": ("local", "ready"), "demo-1": ("far", "lost"),
                      "demo-1-g1": ("local", "ready")}
    assert units(a) == {"demo-0", "demo-1-g1"}
    assert [t for t in said(a) if t.startswith("demo-0 starting")][-1].startswith(
        "demo-0 starting: started as llmgw-demo-0")


def json_state(cli, name):
    return {n["name"]: n["state"] for n in json.loads(cli("nodes", "--json").output)}[name]
