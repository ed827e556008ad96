"""The gateway's own HTTP/1.1 client for plain-http engines, against real servers on loopback
sockets: body framings read in pieces, kept-alive connections reused (and replaced when the
engine closed them), a cut-off answer closing the connection, and the timeouts."""
import socket
import threading
import time

import pytest

from llmgw.web.upstream_http import (Broken, ConnectFailed, HeadTimeout, ReadTimedOut,
                                     Upstreams)
from tests.conftest import free_port


class Server:
    """A TCP server on 127.0.0.1 that runs handler(conn, server) for each connection in a
    thread, and counts the connections it accepted."""

    def __init__(self, handler):
        self.handler = handler
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        self.accepted = 0
        self.requests = []  # (head, body) as they came
        self.events = {}
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, path="/v1/chat/completions"):
        return f"http://127.0.0.1:{self.port}{path}"

    def event(self, name):
        return self.events.setdefault(name, threading.Event())

    def _accept(self):
        while not self.stopped:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                self.handler(conn, self)
            except OSError:
                pass

    def read_request(self, conn):
        """Return (head, body) of the next request on conn, or None when the client closed it."""
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = conn.recv(65536)
            if not data:
                return None
            buf += data
        head, _, body = buf.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append((head, body))
        return head, body

    def close(self):
        self.stopped = True
        self.listener.close()


@pytest.fixture
def serve():
    servers = []

    def make(handler):
        servers.append(Server(handler))
        return servers[-1]
    yield make
    for s in servers:
        s.close()


def post(http, server, body=b'{"x": 1}', headers=None, head_timeout=5.0):
    return http.post(server.url(), body, headers or {"Content-Type": "application/json"}, 2.0,
                     head_timeout)


def ask_times(http, server, times, expect, pause=0.0):
    """Make `times` requests one after another, each read to its end and its answer checked."""
    for _ in range(times):
        response = post(http, server)
        assert b"".join(read_all(response)) == expect
        response.finish(True)
        time.sleep(pause)


def read_all(response, n=65536, timeout=5.0):
    parts = []
    while True:
        response.set_read_timeout(timeout)
        chunk = response.read1(n)
        if not chunk:
            return parts
        assert len(chunk) <= n
        parts.append(chunk)


def keep_answering(conn, server, body=b'{"ok": true}'):
    while server.read_request(conn) is not None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))


def test_the_request_head_is_plain_http_1_1(serve):
    server = serve(keep_answering)
    response = post(Upstreams(), server, b'{"a": 2}',
                    {"Content-Type": "application/json", "Authorization": "Bearer k"})
    assert response.status == 200 and b"".join(read_all(response)) == b'{"ok": true}'
    response.finish(True)
    head, body = server.requests[0]
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/chat/completions HTTP/1.1"
    fields = dict(line.split(": ", 1) for line in lines[1:])
    assert fields == {"Host": f"127.0.0.1:{server.port}", "Accept-Encoding": "identity",
                      "Content-Type": "application/json", "Authorization": "Bearer k",
                      "Content-Length": "8"}
    assert body == b'{"a": 2}'


def test_a_chunked_body_is_decoded_as_it_arrives(serve):
    pieces = [b"data: one\n\n", b"data: two\n\n", b"x" * 5000, b"data: [DONE]\n\n"]

    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        for i, piece in enumerate(pieces):
            framed = b"%x;ext=1\r\n%s\r\n" % (len(piece), piece) if i == 1 else \
                b"%X\r\n%s\r\n" % (len(piece), piece)
            # byte by byte for the first: the framing itself arrives split anywhere
            if i == 0:
                for b in range(len(framed)):
                    conn.sendall(framed[b:b + 1])
                    time.sleep(0.001)
            else:
                conn.sendall(framed)
            time.sleep(0.02)
        conn.sendall(b"0\r\nX-Trailer: yes\r\n\r\n")
        keep_answering(conn, server)

    server = serve(handler)
    http = Upstreams()
    response = post(http, server)
    assert response.headers.get("content-type") == "text/event-stream"
    got = read_all(response, n=1000)
    assert b"".join(got) == b"".join(pieces)
    assert len(got) >= 8  # came in pieces: nothing waited for a full buffer
    response.finish(True)
    again = post(http, server)  # the trailer was consumed: the connection is clean for reuse
    assert b"".join(read_all(again)) == b'{"ok": true}'
    again.finish(True)
    assert server.accepted == 1


def test_a_content_length_body_is_read_in_pieces(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 30\r\n\r\n0123456789")
        time.sleep(0.05)
        conn.sendall(b"abcdefghij")
        time.sleep(0.05)
        conn.sendall(b"ABCDEFGHIJ")
        keep_answering(conn, server)

    server = serve(handler)
    response = post(Upstreams(), server)
    got = read_all(response, n=4)
    assert b"".join(got) == b"0123456789abcdefghijABCDEFGHIJ"
    assert max(len(g) for g in got) == 4
    response.finish(True)


def test_a_body_that_ends_with_the_connection_is_read_to_the_close(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{\"par")
        time.sleep(0.05)
        conn.sendall(b"tial\": 1}")
        conn.shutdown(socket.SHUT_WR)
        server.event("closed").set()
        server.read_request(conn)

    server = serve(handler)
    http = Upstreams()
    response = post(http, server)
    got = read_all(response)
    assert b"".join(got) == b'{"partial": 1}' and len(got) == 2
    response.finish(True)
    assert not any(http.lean.idle.values())  # not reusable: its end was the close


def test_a_kept_alive_connection_is_reused(serve):
    server = serve(keep_answering)
    http = Upstreams()
    ask_times(http, server, 5, b'{"ok": true}')
    assert server.accepted == 1 and len(server.requests) == 5


def test_connection_close_is_honoured(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok")

    server = serve(handler)
    http = Upstreams()
    ask_times(http, server, 3, b"ok")
    assert server.accepted == 3


def test_an_idle_connection_the_engine_closed_is_replaced(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if server.accepted == 1:
            return  # closed while idle, as an engine's keep-alive timeout does
        keep_answering(conn, server, b"ok")

    server = serve(handler)
    http = Upstreams()
    ask_times(http, server, 3, b"ok", pause=0.05)  # the engine closes its end meanwhile
    assert server.accepted == 2


def test_idle_connections_their_engine_closed_do_not_wait_in_close_wait(serve):
    closed = threading.Event()

    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if server.accepted == 1:
            return closed.set()  # as an engine's keep-alive timeout does, while idle here
        keep_answering(conn, server, b"ok")

    first, other = serve(handler), serve(lambda conn, server: keep_answering(conn, server, b"ok"))
    http = Upstreams()
    http.lean.sweep_every = 0  # each request sweeps
    ask_times(http, first, 1, b"ok")
    (idle,) = http.lean.idle[("127.0.0.1", first.port)]
    assert closed.wait(5)
    time.sleep(0.1)  # the FIN arrives: our end of it is now in CLOSE_WAIT
    ask_times(http, other, 1, b"ok")  # a request to another engine sweeps every pool
    assert ("127.0.0.1", first.port) not in http.lean.idle and idle.fileno() == -1
    assert len(http.lean.idle[("127.0.0.1", other.port)]) == 1  # a live one stays


def test_a_connection_that_dies_as_it_is_reused_is_retried_once_on_a_new_one(serve):
    """The close races the request: it was sent on the old connection, which ends (or is
    reset) without a byte of answer."""
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        if server.accepted == 1:
            server.read_request(conn)  # takes the second request and closes unanswered
            return
        keep_answering(conn, server, b"ok")

    server = serve(handler)
    http = Upstreams()
    ask_times(http, server, 2, b"ok")
    assert server.accepted == 2 and len(server.requests) == 3


def test_a_fresh_connection_closed_without_an_answer_fails_over(serve):
    def handler(conn, server):
        server.read_request(conn)

    server = serve(handler)
    with pytest.raises(ConnectFailed):
        post(Upstreams(), server)
    assert server.accepted == 1  # no retry on a fresh connection


def test_finishing_an_unread_body_closes_the_connection(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        conn.settimeout(5)
        if conn.recv(1) == b"":  # the gateway hung up: an engine stops generating here
            server.event("eof").set()

    server = serve(handler)
    http = Upstreams()
    response = post(http, server)
    response.set_read_timeout(5)
    assert response.read1(100) == b"hello"
    response.finish(False)
    assert server.event("eof").wait(5)
    assert not any(http.lean.idle.values())


def test_a_complete_body_read_to_its_end_is_pooled_but_not_one_finished_early(serve):
    server = serve(keep_answering)
    http = Upstreams()
    response = post(http, server)
    response.finish(True)  # "complete" said too soon: the body was not read, so it is closed
    assert not any(http.lean.idle.values())
    response = post(http, server)
    read_all(response)
    response.finish(True)
    assert sum(map(len, http.lean.idle.values())) == 1
    assert server.accepted == 2


def test_no_response_head_in_time_is_a_head_timeout(serve):
    def handler(conn, server):
        server.read_request(conn)
        time.sleep(2)

    server = serve(handler)
    started = time.monotonic()
    with pytest.raises(HeadTimeout):
        post(Upstreams(), server, head_timeout=0.3)
    assert time.monotonic() - started < 1.5


def test_a_head_that_trickles_in_is_still_bounded(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        for _ in range(40):  # a valid head, a byte at a time, never ending
            conn.sendall(b"X-Pad: 1\r\n"[_ % 10:_ % 10 + 1])
            time.sleep(0.05)

    server = serve(handler)
    started = time.monotonic()
    with pytest.raises(HeadTimeout):
        post(Upstreams(), server, head_timeout=0.4)
    assert time.monotonic() - started < 1.2


def test_nothing_listening_is_connect_failed():
    with pytest.raises(ConnectFailed):
        Upstreams().post(f"http://127.0.0.1:{free_port()}/v1/chat/completions", b"{}", {}, 1.0,
                         1.0)


def test_silence_in_the_body_is_a_read_timeout_and_a_cut_body_is_broken(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
        time.sleep(0.6)
        # then the engine dies half-way

    server = serve(handler)
    response = post(Upstreams(), server)
    response.set_read_timeout(1)
    assert response.read1(100) == b"12345"
    response.set_read_timeout(0.2)
    with pytest.raises(ReadTimedOut):
        response.read1(100)
    response.set_read_timeout(2)
    with pytest.raises(Broken):
        response.read1(100)
    response.finish(False)


def test_a_chunked_body_cut_short_or_garbled_is_broken(serve):
    def cut(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel")

    def garbled(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n")
        time.sleep(1)

    for handler, first in ((cut, b"hel"), (garbled, None)):
        response = post(Upstreams(), serve(handler))
        response.set_read_timeout(2)
        if first:
            assert response.read1(100) == first
        with pytest.raises(Broken):
            response.read1(100)
        response.finish(False)


def test_interim_responses_headers_and_statuses(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.02)
        conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                     b"X-Many: a\r\nx-many: b\r\nContent-Length: 2\r\n\r\n{}")
        keep_answering(conn, server)

    server = serve(handler)
    response = post(Upstreams(), server)
    assert response.status == 503
    assert response.headers.get("Content-Type") == "application/json"
    assert response.headers.get("X-MANY") == "a, b"
    assert response.headers.get("X-None", "dflt") == "dflt"
    assert b"".join(read_all(response)) == b"{}"
    response.finish(True)


def test_a_reply_that_is_not_http_fails_over(serve):
    def handler(conn, server):
        server.read_request(conn)
        conn.sendall(b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
        time.sleep(0.5)

    with pytest.raises(ConnectFailed):
        post(Upstreams(), serve(handler))


def test_https_and_proxied_hosts_stay_on_urllib3(monkeypatch):
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    http = Upstreams()
    assert http._manager("http", "localhost") is None  # ours
    assert http._manager("http", "engine.example") is not None  # through the proxy: urllib3
    assert http._manager("https", "api.example") is not None


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="TCP_USER_TIMEOUT is Linux's")
def test_connections_to_engines_carry_the_liveness_bound(serve):
    """A host that goes silent must not hold a request for TCP's own minutes: every connection
    is made with keepalive probes and TCP_USER_TIMEOUT set to gateway.engine_liveness."""
    server = serve(keep_answering)
    http = Upstreams()
    response = http.post(server.url(), b"{}", {}, 2.0, 5.0, 12)
    assert b"".join(read_all(response)) == b'{"ok": true}'
    response.finish(True)
    (sock,) = http.lean.idle[("127.0.0.1", server.port)]
    got = {name: sock.getsockopt(level, option) for name, level, option in (
        ("keepalive", socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        ("idle", socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        ("interval", socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        ("count", socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
        ("user_timeout_ms", socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))}
    assert got == {"keepalive": 1, "idle": 3, "interval": 3, "count": 4, "user_timeout_ms": 12000}
