"""A login's password hash runs in gevent's thread pool: the streams the same gunicorn worker
relays meanwhile keep flowing (on the hub, every one of them would stop for the hash's whole
CPU time)."""
import re
import threading
import time

import pytest
import requests

from tests.conftest import free_port, free_port_range
from tests.e2e.conftest import ControlPlane, cli, stop_served, tune, wait_for

pytestmark = pytest.mark.e2e


def hash_cpu_seconds():
    """The CPU time of one password check as the server does it (the least of three)."""
    from werkzeug.security import check_password_hash, generate_password_hash
    stored = generate_password_hash("x" * 16, method="scrypt")
    times = []
    for _ in range(3):
        started = time.process_time()
        check_password_hash(stored, "y" * 16)
        times.append(time.process_time() - started)
    return min(times)


def test_a_login_during_fifty_streams_of_one_worker_does_not_stop_them(tmp_path):
    root = tmp_path / "root"
    port = free_port()
    cli(root, "demo", "--no-serve", "--listen", f"127.0.0.1:{port}")
    base = free_port_range(20)
    text = (root / "server.toml").read_text()
    (root / "server.toml").write_text(text.replace(
        "interval = 5", f"interval = 1\nport_range = \"{base}-{base + 20}\""))
    tune(root, "server", workers=1)
    cli(root, "model", "add", "paced", "--engine", "sim", "--arg=--token-delay", "--arg=0.05")
    key = cli(root, "keys", "create").stdout.strip()
    made = cli(root, "users", "create", "ops@example.com", "--admin").stdout
    password = re.search(r"password:? (\S+)", made).group(1)
    plane = ControlPlane(root, port)
    url = plane.url
    try:
        plane.start()

        def ready():
            try:
                return requests.post(url + "/v1/chat/completions", timeout=5, headers={
                    "Authorization": f"Bearer {key}"}, json={"model": "paced", "max_tokens": 1,
                                                            "messages": []}).status_code == 200
            except requests.RequestException:
                return False
        wait_for("the paced replica", ready, timeout=120, every=0.5)
        arrivals = [[] for _ in range(50)]

        def stream(i):
            r = requests.post(url + "/v1/chat/completions", stream=True, timeout=60,
                              headers={"Authorization": f"Bearer {key}"},
                              json={"model": "paced", "max_tokens": 80, "stream": True,
                                    "messages": [{"role": "user", "content": "go"}]})
            for line in r.iter_lines():
                if line.startswith(b"data: {"):
                    arrivals[i].append(time.monotonic())
        threads = [threading.Thread(target=stream, args=(i,)) for i in range(50)]
        for t in threads:
            t.start()
        wait_for("every stream to flow", lambda: all(len(a) >= 5 for a in arrivals), timeout=60, every=0.05)
        browser = requests.Session()
        page = browser.get(url + "/login", timeout=30).text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
        login_started = time.monotonic()
        done = browser.post(url + "/login", timeout=30, allow_redirects=False,
                            data={"email": "ops@example.com", "password": password, "csrf_token": token})
        login_ended = time.monotonic()
        assert done.status_code == 302, done.text[:300]
        for t in threads:
            t.join(60)
        # The largest pause of any stream that overlapped the login.
        gaps = [b - a for times in arrivals for a, b in zip(times, times[1:])
                if b > login_started and a < login_ended]
        cpu = hash_cpu_seconds()
        print(f"login took {login_ended - login_started:.3f} s; the hash's own CPU time "
              f"{cpu * 1000:.0f} ms; the largest gap between chunks during it {max(gaps) * 1000:.0f} ms "
              f"over {len(gaps)} gaps")
        assert gaps and max(gaps) < cpu
    finally:
        if plane.proc is not None:
            stop_served(plane.proc, root)  # the web server, and the engines its reconciler started
