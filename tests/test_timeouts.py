"""The gateway's three timeouts: the first byte, silence between bytes, and the whole answer.
A real simulated engine plays the slow replica; each case says which timeout ended it and is
billed for what the client received."""
import json
import subprocess
import sys
import time

import pytest
import requests

from llmgw.cli import llmgw
from llmgw.models import Usage
from llmgw.services import tenancy
from tests.conftest import TOP, free_port, reconcile, settle_now


@pytest.fixture
def slow(app, runner, root):
    """Return make(first_byte_delay, token_delay) -> auth headers for model 'slow' on a fresh
    engine registered as an external endpoint."""
    procs = []

    def make(first_byte_delay=0.0, token_delay=0.01, prefill_delay=0.0):
        port = free_port()
        procs.append(subprocess.Popen(
            [sys.executable, str(TOP / "llmgw" / "scripts" / "sim_engine.py"), "--model", "slow",
             "--port", str(port), "--token-delay", str(token_delay),
             "--first-byte-delay", str(first_byte_delay), "--prefill-delay", str(prefill_delay)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                requests.get(url + "/health", timeout=1)
                break
            except requests.RequestException:
                time.sleep(0.05)
        out = runner.invoke(llmgw, ["endpoint", "add", "slow", "--url", url + "/v1", "--model", "slow",
                                    "--root", str(root)])
        assert out.exit_code == 0, out.output
        reconcile(app.config["LLMGW"])
        _, key = tenancy.create_key("default")
        return {"Authorization": f"Bearer {key}"}
    make.procs = procs
    yield make
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def _ask(client, headers, **kw):
    body = {"model": "slow", "max_tokens": 40, "messages": [{"role": "user", "content": "hi"}], **kw}
    started = time.monotonic()
    resp = client.post("/v1/chat/completions", headers=headers, json=body, buffered=True)
    return resp, time.monotonic() - started


def _last_usage(app):
    settle_now(app)
    u = Usage.select().order_by(Usage.id.desc()).get()
    return u.status, u.completion_tokens


def test_a_replica_that_does_not_start_answering_gets_a_504_naming_the_setting(app, client, slow):
    headers = slow(first_byte_delay=2.0)
    app.config["LLMGW"]["gateway"]["first_byte_timeout"] = 0.3
    resp, took = _ask(client, headers, stream=True)
    assert resp.status_code == 504 and took < 1.5
    err = resp.get_json()["error"]
    assert err["code"] == "upstream_timeout" and "gateway.first_byte_timeout" in err["message"]
    assert _last_usage(app) == (504, 0)


def test_a_stream_past_the_generation_timeout_ends_with_an_error_event(app, client, slow):
    headers = slow(token_delay=0.1)
    app.config["LLMGW"]["gateway"]["generation_timeout"] = 0.55
    resp, took = _ask(client, headers, stream=True)
    assert resp.status_code == 200 and took < 1.5  # 40 tokens would take 4 s
    events = [e[6:] for e in resp.get_data(as_text=True).split("\n\n") if e.startswith("data: ")]
    last = json.loads(events[-1])
    assert last["error"]["code"] == "upstream_timeout"
    assert "gateway.generation_timeout" in last["error"]["message"]
    status, tokens = _last_usage(app)
    assert status == 504 and 2 <= tokens <= 7  # billed for what it got, not the 40 asked for


def test_a_replica_that_goes_quiet_mid_stream_is_cut_off_after_the_read_timeout(app, client, slow):
    headers = slow(token_delay=1.0)
    app.config["LLMGW"]["gateway"]["read_timeout"] = 0.3
    resp, took = _ask(client, headers, stream=True, max_tokens=5)
    assert took < 1.5
    last = json.loads([e for e in resp.get_data(as_text=True).split("\n\n") if e.startswith("data: ")][-1][6:])
    assert "gateway.read_timeout" in last["error"]["message"]


def test_a_whole_answer_past_the_generation_timeout_is_a_504(app, client, slow):
    headers = slow(first_byte_delay=2.0)
    app.config["LLMGW"]["gateway"]["generation_timeout"] = 0.4
    resp, took = _ask(client, headers)
    assert resp.status_code == 504 and took < 1.5
    assert "gateway.generation_timeout" in resp.get_json()["error"]["message"]


def test_a_stream_whose_first_event_does_not_come_is_cut_at_the_first_byte_timeout(app, client, slow):
    headers = slow(prefill_delay=2.0)  # headers at once, then a long silence (vLLM's way)
    app.config["LLMGW"]["gateway"]["first_byte_timeout"] = 0.3
    resp, took = _ask(client, headers, stream=True)
    assert resp.status_code == 200 and took < 1.5
    events = [e for e in resp.get_data(as_text=True).split("\n\n") if e.startswith("data: ")]
    assert "gateway.first_byte_timeout" in json.loads(events[-1][6:])["error"]["message"]
    assert _last_usage(app) == (504, 0)


def test_an_engine_that_dies_mid_stream_ends_the_stream_with_an_error(app, client, slow):
    headers = slow(token_delay=0.2)
    engine = slow.procs[-1]
    resp = client.post("/v1/chat/completions", headers=headers, buffered=False, json={
        "model": "slow", "max_tokens": 40, "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    got = b""
    for piece in resp.response:
        got += piece
        if got.count(b'"content"') >= 3:
            engine.kill()
            engine.wait()
    resp.close()
    last = json.loads([e for e in got.decode().split("\n\n") if e.startswith("data: ")][-1][6:])
    assert last["error"]["code"] == "upstream_broken"
    status, tokens = _last_usage(app)
    assert status == 502 and 2 <= tokens <= 5  # billed for what it carried


def test_a_stream_closed_before_its_body_began_counts_down_and_is_settled(app, slow):
    """gunicorn closes a response without reading it when sending its headers fails (the
    client left): the generator never ran, and neither did its cleanup."""
    from werkzeug.test import EnvironBuilder
    headers = slow(token_delay=0.05)
    environ = EnvironBuilder(path="/v1/chat/completions", method="POST", headers=headers, json={
        "model": "slow", "max_tokens": 40, "stream": True,
        "messages": [{"role": "user", "content": "hi"}]}).get_environ()
    started = []
    body = app(environ, lambda status, headers, exc_info=None: started.append(status))
    assert started == ["200 OK"]
    body.close()  # as gunicorn does when the headers could not be sent: not a byte read
    routes = app.extensions["llmgw.gateway"][0]
    assert set(routes.inflight.values()) == {0}, routes.inflight
    assert _last_usage(app)[0] == 499
