"""An external OpenAI-compatible server is health-checked, then routed to like a replica."""
import time

from llmgw import secrets_box
from llmgw.cli import llmgw
from llmgw.models import Endpoint
from llmgw.services import tenancy
from tests.conftest import reconcile


def test_an_external_endpoint_is_routed_to_once_it_answers(app, runner, root, client, sim_engine):
    conf = app.config["LLMGW"]
    out = runner.invoke(llmgw, ["endpoint", "add", "ext", "--url", sim_engine + "/v1", "--model", "sim",
                                "--api-key", "--root", str(root)], input="upstream-secret\n")
    assert out.exit_code == 0 and "key stored encrypted" in out.output
    row = Endpoint.get(Endpoint.name == "ext")
    assert "upstream-secret" not in row.api_key
    assert secrets_box.unseal(conf["_root"], row.api_key) == "upstream-secret"
    _, key = tenancy.create_key("default")
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "sim", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", headers=headers, json=body).status_code == 503
    reconcile(conf)
    assert Endpoint.get(Endpoint.name == "ext").state == "ready"
    time.sleep(0.3)  # the gateway looks again before a 503 at most every 250 ms
    resp = client.post("/v1/chat/completions", headers=headers, json=body)
    assert resp.status_code == 200 and resp.get_json()["choices"][0]["message"]["content"] == "this is a"


def test_an_endpoint_that_does_not_answer_is_not_routed_and_says_why(app, runner, root, client):
    runner.invoke(llmgw, ["endpoint", "add", "gone", "--url", "http://127.0.0.1:9/v1", "--model", "x",
                          "--root", str(root)])
    reconcile(app.config["LLMGW"])
    row = Endpoint.get(Endpoint.name == "gone")
    assert row.state == "unreachable" and "did not answer" in row.detail
    _, key = tenancy.create_key("default")
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "x", "messages": [{"role": "user", "content": "hi"}]})
    # The client learns the state, not the endpoint's name or address (the row keeps the why).
    message = resp.get_json()["error"]["message"]
    assert resp.status_code == 503 and "an external endpoint unreachable" in message
    assert "gone" not in message and "127.0.0.1" not in message


def test_a_bad_url_is_refused_by_name(runner, root, app):
    out = runner.invoke(llmgw, ["endpoint", "add", "e", "--url", "ftp://x", "--model", "m", "--root", str(root)])
    assert out.exit_code != 0 and "--url 'ftp://x' is not an http(s) URL" in out.output


def test_a_replica_that_refuses_the_connection_is_passed_over_for_the_next(app, client, sim_engine):
    from tests.conftest import free_port
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    Endpoint.create(name="dead", url=dead, models=["sim"], state="ready")
    Endpoint.create(name="live", url=sim_engine + "/v1", models=["sim"], state="ready")
    _, key = tenancy.create_key("default")
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "sim", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(4):  # whichever the router tries first, the answer comes from the live one
        resp = client.post("/v1/chat/completions", headers=headers, json=body)
        assert resp.status_code == 200, resp.get_data(as_text=True)
    Endpoint.delete().where(Endpoint.name == "live").execute()
    time.sleep(2.1)  # past the route cache
    resp = client.post("/v1/chat/completions", headers=headers, json=body)
    assert resp.status_code == 502 and resp.get_json()["error"]["code"] == "upstream_unreachable"


def test_a_replica_whose_engine_key_this_plane_cannot_open_is_left_out_once_logged(app, client, caplog):
    from cryptography.fernet import Fernet

    from llmgw.models import Model, Node, Replica
    from llmgw.services import tenancy
    model = Model.create(name="demo", engine="sim", source="", sha256="", replicas=1)
    node = Node.create(name="n1", addr="127.0.0.1", reachable=True)
    from llmgw import secrets_box
    secrets_box.ensure(app.config["LLMGW"]["_root"])  # this plane's own key file, as init makes it
    other_plane = Fernet(Fernet.generate_key()).encrypt(b"sk-engine-x").decode()
    Replica.create(name="demo-0", slot="demo-0", model=model, node=node, port=1, state="ready",
                   endpoint="http://127.0.0.1:1", engine_key=other_plane)
    _, key = tenancy.create_key("default")
    app.config["LLMGW"]["gateway"]["route_cache_seconds"] = 0  # every request reads the routes
    for _ in range(3):
        resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                           json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]})
        assert resp.status_code == 503
        assert "a replica whose engine key this control plane cannot read" in resp.get_json()["error"]["message"]
    said = [r.getMessage() for r in caplog.records if "cannot be decrypted" in r.getMessage()]
    assert len(said) == 1 and "replica demo-0's stored key" in said[0] and "fernet.key" in said[0]
