"""What gunicorn's own HTTP parser refuses reaches API clients in OpenAI's error shape.

gunicorn answers these before the app sees the request; served with llmgw's worker (as
deploy/gunicorn.conf.py does) the answer is JSON, not gunicorn's HTML page."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import TOP, free_port


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    port = free_port()
    env = {"PATH": os.environ["PATH"], "HOME": str(root), "LLMGW_ROOT": str(root)}
    subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", "init",
                    "--listen", f"127.0.0.1:{port}"], cwd=TOP, env=env, check=True,
                   capture_output=True, timeout=120)
    proc = subprocess.Popen([sys.executable, "-m", "gunicorn", "-c", "deploy/gunicorn.conf.py",
                             "--workers", "1", "wsgi:app"], cwd=TOP, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=open(root / "gunicorn.log", "w"))
    try:
        for _ in range(600):  # up in a second or two; a minute on a crawling machine
            if proc.poll() is not None:
                raise AssertionError((root / "gunicorn.log").read_text()[-2000:])
            if exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", whole=False).startswith(b"HTTP/1.1 200"):
                break
            time.sleep(0.1)
        yield port
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def exchange(port, raw, whole=True):
    """Send raw bytes; return what comes back until the server closes (or the first read)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(raw)
            out = b""
            while True:
                try:
                    data = s.recv(65536)
                except ConnectionResetError:
                    break  # gunicorn closes with the rest of a long request line unread
                if not data:
                    break
                out += data
                if not whole:
                    break
            return out
    except OSError:
        return b""


CASES = {
    "a 10,000-character bearer": (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                                  + b"k" * 10000 + b"\r\n\r\n", 431),
    "a Content-Length that is not digits": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                            b"Content-Length: 12a\r\n\r\n{}", 400),
    "a Content-Length in Arabic-Indic digits": ("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                                "Content-Length: \u0661\u0662\r\n\r\n{}".encode(), 400),
    "Content-Length beside Transfer-Encoding": (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                                               b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", 400),
    "a head ended by bare LF": (b"GET /v1/models HTTP/1.1\nHost: x\n\n", 400),
    "a request line that is not one": (b"GARBAGE\r\n\r\n", 400),
    "a 9,000-character path": (b"GET /v1/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414),
}


@pytest.mark.parametrize("case", CASES)
def test_a_request_gunicorn_refuses_gets_an_openai_error(served, case):
    raw, status = CASES[case]
    answer = exchange(served, raw)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), answer[:300]
    assert b"Content-Type: application/json" in head
    error = json.loads(body)["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == f"http_{status}"
    assert error["message"] and len(error["message"]) <= 301


def test_an_ordinary_request_still_reaches_the_app(served):
    answer = exchange(served, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401 ") and b'"invalid_request_error"' in answer
