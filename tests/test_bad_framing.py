"""An engine whose response breaks HTTP/1.1's framing: the request fails at once with an
OpenAI-shaped 502 (or fails over to a replica that answers), never by a timeout minutes later;
the endpoint is counted down and the request settled. A raw socket server sends exactly the
bytes of each case."""
import json

import pytest

from llmgw.cli import llmgw
from llmgw.models import Usage
from llmgw.services import tenancy
from tests.conftest import reconcile, settle_now
from tests.test_upstream_http import Server

MODELS = b'{"object": "list", "data": [{"id": "raw", "object": "model"}]}'
BAD = {
    "content-length-not-digits": b"HTTP/1.1 200 OK\r\nContent-Length: 1x\r\n\r\n{}",
    "content-length-not-ascii": b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}",
    "content-length-twice": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    "transfer-encoding-and-content-length":
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    "folded-header": b"HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 2\r\n\r\n{}",
    "bare-lf-head": b"HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 2\n\n{}",
    "bare-lf-end-of-head": b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\n{}",
}


def raw_engine(answer):
    def handler(conn, server):
        while (request := server.read_request(conn)) is not None:
            head = request[0]
            if head.startswith(b"GET"):  # the endpoint's health probe
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(MODELS), MODELS))
            else:
                conn.sendall(answer)
                return  # and leave the connection open: a timeout is what must not happen
                # (the handler's return closes it only after the gateway has answered)
    return Server(handler)


@pytest.fixture
def gateway(app, runner, root):
    servers = []

    def make(*answers):
        for i, answer in enumerate(answers):
            server = raw_engine(answer)
            servers.append(server)
            out = runner.invoke(llmgw, ["endpoint", "add", f"raw{i}", "--url", server.url("/v1"),
                                        "--model", "raw", "--root", str(root)])
            assert out.exit_code == 0, out.output
        reconcile(app.config["LLMGW"])
        _, key = tenancy.create_key("default")
        return {"Authorization": f"Bearer {key}"}
    yield make
    for s in servers:
        s.close()


def ask(client, headers, **kw):
    return client.post("/v1/chat/completions", headers=headers, json={
        "model": "raw", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], **kw})


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_response_http_forbids_is_a_502_at_once_counted_down_and_settled(app, client, gateway, case):
    app.config["LLMGW"]["gateway"]["first_byte_timeout"] = 30
    app.config["LLMGW"]["gateway"]["generation_timeout"] = 30
    headers = gateway(BAD[case])
    for stream in (False, True):
        resp = ask(client, headers, stream=stream)
        assert resp.status_code == 502, resp.get_data(as_text=True)
        err = resp.get_json()["error"]
        assert err["type"] == "server_error" and "not valid HTTP/1.1" in err["message"], err
        routes = app.extensions["llmgw.gateway"][0]
        assert set(routes.inflight.values()) == {0}, routes.inflight
        settle_now(app)
        assert Usage.select().order_by(Usage.id.desc()).get().status == 502
    from llmgw.web.relay import settlement
    with app.app_context():
        assert not settlement().ledger.inflight  # nothing of it is still in flight


def test_a_replica_that_breaks_the_framing_is_passed_over_for_one_that_answers(app, client, gateway):
    good = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(b := json.dumps({"id": "x", "object": "chat.completion", "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()), b))
    headers = gateway(BAD["bare-lf-head"], good)
    answered = [ask(client, headers) for _ in range(4)]
    assert [r.status_code for r in answered] == [200] * 4
    assert set(app.extensions["llmgw.gateway"][0].inflight.values()) == {0}


def test_an_engine_refusing_the_gateways_key_is_passed_over_and_never_a_401_to_the_client(app, client, gateway):
    refused = (b"HTTP/1.1 401 Unauthorized\r\nContent-Type: application/json\r\nContent-Length: 36\r\n\r\n"
               b'{"error": {"message": "Invalid key"}}')
    headers = gateway(refused)
    resp = ask(client, headers)
    assert resp.status_code == 502, resp.get_data(as_text=True)
    err = resp.get_json()["error"]
    assert err["code"] == "upstream_unreachable" and "refused the key the gateway gave it (401)" in err["message"]
    assert set(app.extensions["llmgw.gateway"][0].inflight.values()) == {0}
    settle_now(app)
    assert Usage.select().order_by(Usage.id.desc()).get().status == 502
