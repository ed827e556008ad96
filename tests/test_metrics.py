"""GET /metrics: refused without metrics.token, and what it reports (parsed with prometheus_client's
own parser) follows the requests made and the cluster in the database."""
import datetime

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.models import EngineInstall, Model, Node, Replica
from llmgw.services import cluster_metrics
from tests.conftest import reconcile, settle_now


def scrape(client, token="s3cret"):
    r = client.get("/metrics", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.get_data(as_text=True)
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.get_data(as_text=True)) for s in fam.samples}


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))), 0)


def test_metrics_are_off_until_a_token_is_set_and_refused_with_a_wrong_one(app, client):
    r = client.get("/metrics")
    assert r.status_code == 404 and "metrics.token" in r.get_data(as_text=True)
    app.config["LLMGW"]["metrics"]["token"] = "s3cret"
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        r = client.get("/metrics", headers=headers)
        assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
        assert "Authorization: Bearer" in r.get_data(as_text=True)
    assert client.get("/metrics", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_requests_tokens_spend_and_latency_move_with_requests(app, client, local_sim):
    sim = local_sim("0")
    app.config["LLMGW"]["metrics"]["token"] = "s3cret"
    with app.app_context():
        reconcile(sim["conf"], until=lambda: Replica.get_or_none(Replica.state == "ready"))
    from llmgw.models import Price
    Price.create(model="demo", prompt_per_1k=0, completion_per_1k=1_000_000)  # 0.001 a token
    before = scrape(client)
    for stream in (False, True, True):
        r = client.post("/v1/chat/completions", headers=sim["headers"], json={
            "model": "demo", "max_tokens": 5, "stream": stream,
            "messages": [{"role": "user", "content": "日本語 🙂"}]})
        assert r.status_code == 200
        r.get_data()
    settle_now(app)
    from llmgw.web.relay import settlement
    with app.app_context():
        settlement().measure()
    after = scrape(client)
    moved = {name: value(after, name, **labels) - value(before, name, **labels) for name, labels in [
        ("llmgw_requests_total", dict(model="demo", project="default", status="200")),
        ("llmgw_tokens_total", dict(model="demo", project="default", kind="completion")),
        ("llmgw_spend_total", dict(model="demo", project="default")),
        ("llmgw_request_duration_seconds_count", dict(model="demo")),
        ("llmgw_time_to_first_token_seconds_count", dict(model="demo")),
    ]}
    assert moved["llmgw_requests_total"] == 3
    assert moved["llmgw_tokens_total"] == 15  # the simulated engine generates what it is allowed
    assert moved["llmgw_spend_total"] == pytest.approx(0.015)
    assert moved["llmgw_request_duration_seconds_count"] == 3
    assert moved["llmgw_time_to_first_token_seconds_count"] == 2  # the streams
    assert value(after, "llmgw_replicas", model="demo", state="ready") == 1
    assert value(after, "llmgw_replicas_wanted", model="demo") == 1
    assert value(after, "llmgw_node_reachable", node="local") == 1
    assert value(after, "llmgw_nodes", state="ready") == 1
    assert value(after, "llmgw_ssh_commands_total", node="local", outcome="ok") > 0
    assert value(after, "llmgw_requests_in_flight") == 0


def test_a_refusal_counts_by_the_scope_whose_limit_ran_out(app, client, local_sim, runner):
    sim = local_sim("0")
    app.config["LLMGW"]["metrics"]["token"] = "s3cret"
    with app.app_context():
        reconcile(sim["conf"], until=lambda: Replica.get_or_none(Replica.state == "ready"))
    assert runner.invoke(args=["llmgw", "limits", "set", "--project", "default", "--rpm", "1"]).exit_code == 0
    app.config["LLMGW"]["metrics"]["token"] = "s3cret"  # the command read server.toml again
    before = scrape(client)
    codes = [client.post("/v1/chat/completions", headers=sim["headers"], json={
        "model": "demo", "max_tokens": 1, "messages": []}).status_code for _ in range(3)]
    assert codes == [200, 429, 429]
    after = scrape(client)
    labels = dict(scope="project", type="requests")
    assert value(after, "llmgw_rate_limited_total", **labels) - value(before, "llmgw_rate_limited_total", **labels) == 2


def test_the_cluster_families_describe_nodes_gpus_replicas_and_installs(app):
    gpus = [{"index": 0, "class": "h100-80g", "memory_mib": 81559, "memory_used_mib": 1024, "healthy": True},
            {"index": 1, "class": "h100-80g", "memory_mib": 81559, "memory_used_mib": 0, "healthy": False,
             "reason": "fell off the bus"}]
    a = Node.create(name="a", addr="10.0.0.1", reachable=True, facts={"gpus": gpus})
    Node.create(name="b", addr="10.0.0.2", reachable=False)
    Node.create(name="c", addr="10.0.0.3", reachable=True, state="cordoned")
    Node.create(name="d", addr="10.0.0.4", reachable=False, lost_since=datetime.datetime(2026, 1, 1))
    m = Model.create(name="big", source="/m.gguf", replicas=3)
    Replica.create(model=m, node=a, name="big-1", port=18001, state="ready")
    Replica.create(model=m, node=a, name="big-2", port=18002, state="starting")
    EngineInstall.create(node=a, engine="llamacpp", version="b1", state="ready")
    EngineInstall.create(node=a, engine="vllm", version="0.9", state="failed")
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for fam in cluster_metrics.families(*cluster_metrics.read()) for s in fam.samples}
    assert got[("llmgw_nodes", (("state", "ready"),))] == 1
    assert got[("llmgw_nodes", (("state", "unreachable"),))] == 1
    assert got[("llmgw_nodes", (("state", "cordoned"),))] == 1
    assert got[("llmgw_nodes", (("state", "lost"),))] == 1
    assert got[("llmgw_node_reachable", (("node", "b"),))] == 0
    card0 = (("class", "h100-80g"), ("gpu", "0"), ("node", "a"))
    assert got[("llmgw_gpu_memory_bytes", card0)] == 81559 * 2**20
    assert got[("llmgw_gpu_memory_used_bytes", card0)] == 1024 * 2**20
    assert got[("llmgw_gpu_healthy", card0)] == 1
    assert got[("llmgw_gpu_healthy", (("class", "h100-80g"), ("gpu", "1"), ("node", "a")))] == 0
    assert got[("llmgw_replicas", (("model", "big"), ("state", "ready")))] == 1
    assert got[("llmgw_replicas", (("model", "big"), ("state", "starting")))] == 1
    assert got[("llmgw_replicas", (("model", "big"), ("state", "failed")))] == 0
    assert got[("llmgw_replicas_wanted", (("model", "big"),))] == 3
    assert got[("llmgw_engine_installs", (("engine", "vllm"), ("state", "failed")))] == 1
