"""The whole path on one machine without root: a local node, the simulated engine, the gateway."""
import asyncio
import json
import re
import time

import pytest

from llmgw.models import EngineInstall, LogRequest, Model, NodeEvent, Replica
from llmgw.plans import launch
from llmgw.services import tenancy
from llmgw.services.engine_http import engine_key
from llmgw.services.replicas import running_units
from llmgw.services.serving import serve_of
from llmgw.executors.transport import LocalTransport
from llmgw.reconciler import Reconciler
from tests.conftest import reconcile


@pytest.fixture
def cluster(local_sim):
    return local_sim("0.05")


def ready():
    return [r for r in Replica.select() if r.state == "ready"]


def test_a_local_node_serves_a_chat_completion_through_the_gateway(cluster, client):
    reconcile(cluster["conf"], lambda: len(ready()) == 1)
    headers = {"Authorization": f"Bearer {cluster['key']}"}
    resp = client.post("/v1/chat/completions", headers=headers, json={
        "model": "demo", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 200
    body = resp.get_json()
    assert body["choices"][0]["message"]["content"].startswith("this is a")
    assert body["usage"]["completion_tokens"] == 4


def test_a_stream_is_relayed_chunk_by_chunk(cluster, client):
    reconcile(cluster["conf"], lambda: len(ready()) == 1)
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {cluster['key']}"},
                       json={"model": "demo", "stream": True, "max_tokens": 5,
                             "messages": [{"role": "user", "content": "hi"}]}, buffered=False)
    assert resp.status_code == 200 and resp.headers["X-Accel-Buffering"] == "no"
    events = [e for e in b"".join(resp.response).decode().split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "data: [DONE]"
    words = [json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1]]
    assert "".join(words) == "this is a simulated reply"


def test_a_restarted_reconciler_adopts_instead_of_duplicating(cluster):
    conf, node = cluster["conf"], cluster["node"]
    reconcile(conf, lambda: len(ready()) == 1)
    before = Replica.get().endpoint
    reconcile(conf, lambda: len(ready()) == 1)  # a new Reconciler object: a restarted process
    units = asyncio.run(running_units(LocalTransport(), "setsid", node.base_dir))
    assert units == {"demo-0"}
    assert Replica.select().count() == 1 and Replica.get().endpoint == before


def test_the_log_pane_is_answered_by_the_reconciler(cluster, client, auth):
    conf = cluster["conf"]
    reconcile(conf, lambda: len(ready()) == 1)
    auth.login(password=auth.password)
    page = client.get("/nodes/local")
    assert page.status_code == 200 and b"logpane" in page.data
    assert not LogRequest.select().exists()  # a GET changes nothing: the pane asks by POST
    assert b"""hx-vals='{"lines": 300, "probes": "0", "source": "demo-0"}'""" in page.data
    token = page.get_data(as_text=True).split('"X-CSRFToken": "')[1].split('"')[0]
    csrf = {"X-CSRFToken": token}
    assert client.post("/nodes/local/logs", data={"source": "demo-0"}).status_code == 400  # no token
    assert client.post("/nodes/local/logs", data={"source": "nope"}, headers=csrf).status_code == 404
    opened = client.post("/nodes/local/logs", data={"source": "demo-0"}, headers=csrf)
    req = LogRequest.get(LogRequest.state == "pending")
    assert f'hx-post="/nodes/local/logs/{req.id}"'.encode() in opened.data
    assert client.get(f"/nodes/local/logs/{req.id}").status_code == 405
    assert client.post(f"/nodes/local/logs/{req.id}", headers=csrf).status_code == 204
    asyncio.run(Reconciler(conf).answer_log_requests())
    lines = client.post(f"/nodes/local/logs/{req.id}", headers=csrf)
    assert lines.status_code == 200
    assert b"sim: serving demo" in lines.data
    assert b"hx-post=\"/nodes/local/logs/" in lines.data
    # A log file's lines carry no time: the first read's are stamped "at or before" it.
    assert re.search(rb'<span class="ts">\xe2\x89\xa4\d{4}-\d\d-\d\d \d\d:\d\d:\d\d</span> sim: serving demo', lines.data)


def test_a_model_without_a_ready_replica_is_a_503_with_the_reason(app, client):
    Model.create(name="lonely", engine="llamacpp", source="/x.gguf", sha256="0" * 64, replicas=1)
    _, key = tenancy.create_key("default")
    resp = client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": "lonely", "messages": []})
    assert resp.status_code == 503
    assert "No ready replica of 'lonely'" in resp.get_json()["error"]["message"]


def test_a_changed_model_restarts_its_replica_with_the_new_settings(cluster):
    conf, node = cluster["conf"], cluster["node"]
    reconcile(conf, lambda: len(ready()) == 1)
    pid = (node_dir(node) / "run" / "llmgw-demo-0.pid").read_text().strip()
    old_key = engine_key(conf, Replica.get())
    Model.update(args=["--token-delay", "0.01"]).where(Model.name == "demo").execute()
    reconcile(conf, lambda: Replica.get().state == "restarting")  # out of routing first
    reconcile(conf, lambda: Replica.get().state == "pending")
    assert Replica.get().detail == "restarting to apply the model's new settings; its requests done"
    reconcile(conf, lambda: len(ready()) == 1)
    assert (node_dir(node) / "run" / "llmgw-demo-0.pid").read_text().strip() != pid
    # A new engine, a new key: the old one opens nothing any more.
    assert engine_key(conf, Replica.get()) != old_key
    assert _chat(Replica.get().endpoint, {"Authorization": f"Bearer {old_key}"}).status_code == 401
    units = asyncio.run(running_units(LocalTransport(), "setsid", node.base_dir))
    assert units == {"demo-0"}


def _chat(endpoint, headers):
    import requests
    return requests.post(endpoint + "/v1/chat/completions", headers=headers, timeout=10, json={
        "model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


def test_an_engine_answers_only_with_its_own_key_which_is_kept_sealed(cluster, client):
    import requests
    conf, node = cluster["conf"], cluster["node"]
    reconcile(conf, lambda: len(ready()) == 1)
    row = Replica.get()
    key = engine_key(conf, row)
    assert key.startswith("sk-engine-") and len(key) > 40 and key not in row.engine_key
    assert _chat(row.endpoint, {}).status_code == 401
    assert _chat(row.endpoint, {"Authorization": "Bearer sk-engine-guess"}).status_code == 401
    assert requests.get(row.endpoint + "/metrics", timeout=10).status_code == 401
    assert requests.get(row.endpoint + "/health", timeout=10).status_code == 200  # says only "up"
    assert _chat(row.endpoint, engine_headers(conf, row)).status_code == 200
    # The gateway sends it: a client with an llmgw key never sees it.
    through = client.post("/v1/chat/completions", headers=cluster["headers"], json={
        "model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
    assert through.status_code == 200, through.get_json()
    # On the node: a file only its owner reads, named on the command line; the key itself is not.
    key_file = node_dir(node) / "run" / "llmgw-demo-0.key"
    assert key_file.read_text() == key and (key_file.stat().st_mode & 0o777) == 0o600
    pid = (node_dir(node) / "run" / "llmgw-demo-0.pid").read_text().strip()
    argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    assert str(key_file).encode() in argv and not any(key.encode() in a for a in argv)
    # Scaled away, its key file goes with it.
    Model.update(replicas=0).where(Model.name == "demo").execute()
    reconcile(conf, lambda: not Replica.select().exists())
    assert not key_file.exists()


def test_an_engine_started_before_engines_had_keys_is_restarted_with_one(cluster):
    conf = cluster["conf"]
    reconcile(conf, lambda: len(ready()) == 1)
    # As the version before engine keys left it: running without a key, none in its row.
    Replica.update(engine_key="").execute()
    row, node = Replica.get(), cluster["node"]
    serve = serve_of(node, row, row.model, EngineInstall.get(node=node, engine="sim"), "")
    t = LocalTransport()
    asyncio.run(t.run(launch.stop_argv("setsid", row.unit, node.base_dir)))
    asyncio.run(t.check(launch.start_argv("setsid", row.unit, launch.engine_argv(serve), node.base_dir)))
    for _ in range(300):  # the engine is up in well under a second; 30 s if the machine crawls
        if _answers(row.endpoint):
            break
        time.sleep(0.1)
    assert _chat(row.endpoint, {}).status_code == 200  # anyone who reaches its port
    reconcile(conf, lambda: Replica.get().state == "restarting")
    assert Replica.get().detail == ("out of routing to restart with an API key of its own once its "
                                    "requests are done")
    reconcile(conf, lambda: len(ready()) == 1 and Replica.get().engine_key)
    assert NodeEvent.select().where(NodeEvent.text.startswith(
        "stopped demo-0 to give its engine an API key; its requests done")).exists()
    assert _chat(Replica.get().endpoint, {}).status_code == 401


def _answers(endpoint):
    import requests
    try:
        return requests.get(endpoint + "/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def node_dir(node):
    from pathlib import Path
    return Path(node.base_dir)


def test_an_engine_killed_once_is_started_again_at_once(cluster, tmp_path):
    import os
    import signal
    from pathlib import Path
    reconcile(cluster["conf"], lambda: len(ready()) == 1)
    pidfile = Path(cluster["node"].base_dir) / "run" / "llmgw-demo-0.pid"
    pid = int(pidfile.read_text())
    os.kill(pid, signal.SIGKILL)
    reconcile(cluster["conf"], lambda: Replica.get().state == "failed")
    assert Replica.get().detail.startswith("its engine exited; restarting now")
    reconcile(cluster["conf"], lambda: len(ready()) == 1)
    assert int(pidfile.read_text()) != pid and Replica.get().failures == 0


def test_an_install_left_half_done_by_a_dead_reconciler_resumes_on_the_next_pass(cluster):
    import datetime
    from llmgw.models import EngineInstall, utcnow
    reconcile(cluster["conf"], lambda: len(ready()) == 1)
    # What a reconciler killed during a re-install leaves: the row says "installing", and its
    # next verification is minutes away.
    EngineInstall.update(state="installing", detail="checking that sim_engine.py runs",
                         next_check=utcnow() + datetime.timedelta(minutes=10)).execute()
    reconcile(cluster["conf"])
    row = EngineInstall.get(EngineInstall.engine == "sim")
    assert row.state == "ready", row.detail


def test_the_node_s_history_records_installs_and_replicas_coming_and_going(cluster):
    from llmgw.models import NodeEvent
    reconcile(cluster["conf"], lambda: len(ready()) == 1)
    Model.update(replicas=0).where(Model.name == "demo").execute()
    reconcile(cluster["conf"], lambda: NodeEvent.select().where(
        NodeEvent.text.startswith("stopped demo-0")).exists())
    said = [e.text for e in NodeEvent.select().order_by(NodeEvent.id)]
    assert said[0].startswith("sim builtin installing: ") and said[1].startswith("sim builtin ready: ")
    assert any(t.startswith("demo-0 starting: started as llmgw-demo-0 under setsid") for t in said)
    assert any(t.startswith("demo-0 ready: serving on http://127.0.0.1:") for t in said)
    assert said[-1] == "stopped demo-0 (the model has fewer replicas); its requests done"


def stream_from(conf, replica):
    """Start reading a 50-token stream (5 s at the engine's 0.1 s) straight from one replica's
    engine in a thread; return the thread and the dict its whole body lands in."""
    return stream_in_thread(replica.endpoint, "demo", 50, engine_headers(conf, replica), timeout=30)


def engine_headers(conf, replica):
    return {"Authorization": "Bearer " + engine_key(conf, replica)}


def stream_in_thread(endpoint, model, max_tokens, headers, timeout=60):
    """Read a stream of max_tokens straight from an engine (headers: its key) in a thread;
    return the thread and the dict its whole body lands in."""
    import threading
    import requests
    got = {}

    def stream():
        with requests.post(endpoint + "/v1/chat/completions", stream=True, timeout=timeout, headers=headers,
                           json={"model": model, "stream": True, "max_tokens": max_tokens,
                                 "messages": [{"role": "user", "content": "go"}]}) as resp:
            got["body"] = resp.content.decode()
    reader = threading.Thread(target=stream)
    reader.start()
    return reader, got


def test_a_stream_on_a_replica_scaled_away_finishes_with_done(local_sim):
    """model set --replicas shrinks the model while a 5 s stream runs on the replica that goes:
    it leaves routing at once, and is stopped only when its engine says the stream is done."""
    env = local_sim("0.1")
    Model.update(replicas=2).where(Model.name == "demo").execute()
    reconcile(env["conf"], lambda: len(ready()) == 2)
    reader, got = stream_from(env["conf"], Replica.get(Replica.name == "demo-1"))
    Model.update(replicas=1).where(Model.name == "demo").execute()
    reconcile(env["conf"], lambda: not Replica.select().where(Replica.name == "demo-1").exists(),
              timeout=60)
    reader.join(30)
    assert got["body"].rstrip().endswith("data: [DONE]")
    assert got["body"].count("data: ") == 50 + 3  # role, 50 tokens, finish, [DONE]
    assert [r.name for r in ready()] == ["demo-0"]


def test_a_stream_on_a_replica_restarting_for_new_settings_finishes_with_done(local_sim):
    env = local_sim("0.1")
    reconcile(env["conf"], lambda: len(ready()) == 1)
    reader, got = stream_from(env["conf"], Replica.get())
    Model.update(args=["--token-delay", "0.01"]).where(Model.name == "demo").execute()
    reconcile(env["conf"], lambda: Replica.get().state == "pending", timeout=60)
    reader.join(30)
    assert got["body"].rstrip().endswith("data: [DONE]")
    reconcile(env["conf"], lambda: len(ready()) == 1)



def test_a_key_limited_to_one_model_sees_only_that_name_and_no_cluster_detail_in_errors(app, client):
    from llmgw.models import Endpoint
    for name in ("mine", "secret-model"):
        Model.create(name=name, engine="llamacpp", source="/x.gguf", sha256="0" * 64, replicas=1)
    Endpoint.create(name="ep-on-node-7", url="http://10.9.9.9:1/v1", models=["mine"], state="failed",
                    detail="engine log: loading /srv/secret/weights.gguf failed")
    _, key = tenancy.create_key("default", models=["mine"])
    headers = {"Authorization": f"Bearer {key}"}

    def message(model):
        resp = client.post("/v1/chat/completions", headers=headers, json={"model": model, "messages": []})
        return resp.status_code, resp.get_json()["error"]["message"]
    said = [message("nope"), message("secret-model"), message("mine")]
    assert [code for code, _ in said] == [404, 403, 503]
    assert "models this key may use: mine)" in said[0][1]
    for _, text in said:
        assert "secret-model" not in text or text.startswith("This API key may not use the model 'secret-model'")
        assert "ep-on-node-7" not in text and "/srv/secret" not in text and "10.9.9.9" not in text
    assert said[2][1] == ("No ready replica of 'mine': an external endpoint failed. Administrators see "
                          "why on the model's page.")


def test_without_the_key_file_no_key_is_sealed_anew_and_the_replica_says_why(cluster):
    from llmgw import secrets_box
    conf = cluster["conf"]
    reconcile(conf, lambda: len(ready()) == 1)
    key_file = secrets_box.key_path(conf["_root"])
    key_file.unlink()  # as on a second control plane that was never given the file
    with pytest.raises(secrets_box.Unreadable, match="there is no .*fernet.key to open stored keys with"):
        engine_key(conf, Replica.get())
    assert not key_file.exists()  # reading never makes one
    reconcile(conf)
    assert Replica.get().state == "ready"  # still probed (/health needs no key), not failed
    # A restart would seal its new key with a new file that opens none of the stored ones.
    conf["reconciler"]["stop_grace"] = 1  # its load cannot be read without the key: no waiting
    Model.update(args=["--token-delay", "0.01"]).where(Model.name == "demo").execute()
    reconcile(conf, lambda: Replica.get().state == "failed", timeout=60)
    assert "there is no" in Replica.get().detail and "but keys sealed with one are stored" in Replica.get().detail
    assert not key_file.exists()
