"""The gateway as served by gunicorn (4 gevent workers) in front of the simulated engine:
budgets and rpm exact under 50 concurrent streams, streams relayed as they come, and a
client that goes away stops the engine and is billed for what was generated."""
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import requests

from tests.conftest import TOP, free_port, free_port_range
from tests.e2e.conftest import cli, fire_streams, stop_served, wait_for
from tests.harness.engine_keys import engine_auth

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def plane(tmp_path_factory):
    root = tmp_path_factory.mktemp("load") / "root"
    port = free_port()
    cli(root, "demo", "--no-serve", "--listen", f"127.0.0.1:{port}")
    text = (root / "server.toml").read_text()
    base = free_port_range(20)
    text = text.replace("[server]", "[server]\nworkers = 4").replace(
        "interval = 5", f"interval = 1\nport_range = \"{base}-{base + 20}\"")
    text += "\n[gateway]\nshutdown_grace = 3\n"  # the last test stops it with a stream running
    (root / "server.toml").write_text(text)
    cli(root, "model", "add", "demo", "--engine", "sim", "--replicas", "1", "--arg=--token-delay",
        "--arg=0.05", "--arg=--whole-delay", "--arg=0.05")
    key = cli(root, "keys", "create").stdout.strip()
    cli(root, "prices", "set", "demo", "--prompt", "0", "--completion", "1")  # 0.001 a token
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_ROOT"}
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw",
                             "serve", "--root", str(root)], cwd=TOP, env=env, start_new_session=True,
                            stdout=open(root / "serve.log", "w"), stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                r = requests.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                  json={"model": "demo", "max_tokens": 1, "messages": []}, timeout=5)
                if r.status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, (root / "serve.log").read_text()[-2000:]
            time.sleep(0.3)
        wait_for("the first answer to be settled", lambda: project_spend(root, "default"), timeout=10,
                 every=0.1)
    except BaseException:
        stop_served(proc, root)  # a control plane that never answered must not outlive the test
        raise
    yield {"root": root, "url": url, "key": key, "proc": proc}
    stop_served(proc, root)



def fire(plane):
    return [(status, body) for _, status, body in fire_streams([plane["url"]], plane["key"])]


def counters(root, kind, slot="all"):
    """Return (used, reserved) of the default project's counter, money in the currency."""
    with sqlite3.connect(root / "llmgw.db") as db:
        used, reserved = db.execute(
            "SELECT COALESCE(SUM(c.used), 0), COALESCE(SUM(c.reserved), 0) FROM counter c "
            "JOIN project p ON p.id = c.scope_id WHERE c.kind = ? AND c.scope_kind = 'project' "
            "AND p.name = 'default' AND c.slot = ?", (kind, slot)).fetchone()
    scale = 1_000_000 if kind == "budget" else 1
    return used / scale, reserved / scale


def settled_spend(root, project="default"):
    """Wait until every finished request of a project is settled; return its spend in the
    currency. The counter and the usage rows are written in one transaction."""
    def settled():
        used, reserved = counters(root, "budget")
        total = project_spend(root, project) / 1_000_000
        return reserved == 0 and used == total and (used,)
    return wait_for("earlier requests to be settled", settled, timeout=10, every=0.1)[0]


def test_a_budget_for_ten_streams_admits_exactly_ten_of_fifty(plane):
    spent_before = settled_spend(plane["root"])
    # Each stream may cost 10 tokens x 0.001; the budget holds exactly ten more of them.
    cli(plane["root"], "limits", "set", "--project", "default", "--budget",
        f"{spent_before + 0.1:.6f}", "--period", "never")
    time.sleep(1.5)  # workers read limits at most once a second
    results = fire(plane)
    ok = [b for s, b in results if s == 200]
    refused = [b for s, b in results if s == 429]
    assert len(ok) == 10 and len(refused) == 40, [(s, b[:300]) for s, b in results if s not in (200, 429)][:2]
    assert all(b.rstrip().endswith("data: [DONE]") for b in ok)
    assert all("insufficient_quota" in b for b in refused)
    # Each worker settles what has finished every 100 ms, in one transaction.
    used, reserved = wait_for("the workers to settle", lambda: (
        c := counters(plane["root"], "budget"))[1] == 0 and c, timeout=10, every=0.1)
    assert reserved == 0
    assert used - spent_before == pytest.approx(0.1, abs=1e-9)
    cli(plane["root"], "limits", "set", "--project", "default", "--budget", "0")


def test_an_rpm_of_ten_admits_exactly_ten_of_fifty_in_a_minute(plane):
    # A project of its own: the requests of the tests before count in its window otherwise.
    # The window slides, so when the minute turns during the fifty does not matter.
    cli(plane["root"], "project-create", "rpm-ten", "--team", "default")
    key = cli(plane["root"], "keys", "create", "--project", "rpm-ten").stdout.strip()
    cli(plane["root"], "limits", "set", "--project", "rpm-ten", "--rpm", "10")
    time.sleep(1.5)  # workers read limits at most once a second
    results = [(status, body) for _, status, body in fire_streams([plane["url"]], key)]
    codes = [s for s, _ in results]
    assert codes.count(200) == 10 and codes.count(429) == 40, codes
    refused = json.loads(next(b for s, b in results if s == 429))["error"]
    assert re.search(r"Rate limit reached for project 'rpm-ten': 10 requests per minute", refused["message"])
    assert refused["type"] == "requests"


def stream(plane, max_tokens):
    return requests.post(plane["url"] + "/v1/chat/completions", stream=True, timeout=60,
                         headers={"Authorization": f"Bearer {plane['key']}"},
                         json={"model": "demo", "max_tokens": max_tokens, "stream": True,
                               "messages": [{"role": "user", "content": "go"}]})


def test_the_first_chunk_arrives_long_before_the_last(plane):
    started = time.monotonic()
    r = stream(plane, 20)  # 20 tokens 50 ms apart: a second of generation
    arrivals = []
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            arrivals.append(time.monotonic() - started)
    assert len(arrivals) >= 20
    assert arrivals[-1] > 0.9
    assert arrivals[1] < arrivals[-1] / 3, arrivals  # the first token was not held back


def test_a_client_that_leaves_stops_the_engine_and_pays_for_what_it_got(plane):
    r = stream(plane, 200)  # ten seconds' worth
    seen = 0
    for line in r.iter_lines():
        if b'"content"' in line:
            seen += 1
        if seen == 4:
            break
    r.close()
    log = plane["root"] / "node" / "logs" / "llmgw-demo-0.log"
    deadline = time.monotonic() + 15
    row = None
    while time.monotonic() < deadline:
        with sqlite3.connect(plane["root"] / "llmgw.db") as db:
            row = db.execute("SELECT completion_tokens, status FROM usage ORDER BY created DESC LIMIT 1").fetchone()
        if row and row[1] == 499 and "client went away" in log.read_text():
            break
        time.sleep(0.3)
    assert row[1] == 499, row
    assert 3 <= row[0] < 100, row  # what was generated before it left, not the 200 asked for
    assert "client went away after part of a stream" in log.read_text()


CJK = "你好世界，今天天气很好。🙂"
SHAPES = {
    # No cap: the engine, left to itself, would generate 2,000 tokens.
    "no-max-tokens": ("chat/completions", {"messages": [{"role": "user", "content": "go on"}]}),
    "n-4": ("chat/completions", {"max_tokens": 10, "n": 4,
                                 "messages": [{"role": "user", "content": "four ways"}]}),
    # The engine counts a token per character: a characters-per-token guess under-reserves.
    "cjk-prompt": ("chat/completions", {"max_tokens": 5, "messages": [{"role": "user", "content": CJK * 30}]}),
    "embeddings-list": ("embeddings", {"input": [CJK * 5] * 20}),
}


@pytest.mark.parametrize("limit", ["budget", "tpm"])
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_every_request_shape_stays_within_a_limit_for_ten(plane, shape, limit):
    """200 concurrent requests of one shape through 4 workers against a budget, or a tpm, for
    ten of them: what is spent, or the tokens used in any minute, never passes the limit."""
    import concurrent.futures
    import math
    root = plane["root"]
    if "shapes" not in cli(root, "models").stdout:
        cli(root, "model", "add", "shapes", "--engine", "sim", "--arg=--token-delay", "--arg=0",
            "--arg=--count", "--arg=chars", "--arg=--default-tokens", "--arg=2000")
        cli(root, "prices", "set", "shapes", "--prompt", "1", "--completion", "1")  # 0.001 a token
    project = f"shape-{shape}-{limit}"
    cli(root, "project-create", project, "--team", "default")
    key = cli(root, "keys", "create", "--project", project).stdout.strip()
    path, body = SHAPES[shape]

    def one(_):
        r = requests.post(f"{plane['url']}/v1/{path}", json=dict(body, model="shapes"), timeout=120,
                          headers={"Authorization": f"Bearer {key}"})
        return r.status_code
    tried = []  # when each try began: the window holds the first answered one from then on
    wait_for("a shapes replica", lambda: tried.append(time.monotonic()) or one(0) == 200, timeout=120,
             every=0.5)
    started = tried[-1]
    each = wait_for("its use settled", lambda: all(project_use(root, project)) and project_use(root, project),
                    timeout=10, every=0.1)
    # The limit is set after the first request and must count it: ten more fit.
    spend, tokens = 11 * each[0], 11 * each[1]
    if limit == "budget":
        cli(root, "limits", "set", "--project", project, "--budget", money(spend), "--period", "never")
    else:
        cli(root, "limits", "set", "--project", project, "--tpm", str(tokens))
    time.sleep(1.5)  # workers read limits at most once a second
    with concurrent.futures.ThreadPoolExecutor(200) as pool:
        codes = list(pool.map(one, range(200)))
    minutes = math.ceil((time.monotonic() - started) / 60)  # 1 unless this machine crawled
    assert set(codes) <= {200, 429}, codes
    # Leased slices go back within a bucket or two of the last request.
    wait_for("the workers to settle and give back their slices",
             lambda: project_held(root, project) == (0, 0), timeout=30, every=0.1)
    used = project_use(root, project)
    print(f"{shape}, {limit}: one uses {money(each[0])} and {each[1]} tokens; {codes.count(200)} "
          f"of 200 admitted; used " + (f"{money(used[0])} of a budget of {money(spend)}" if limit == "budget"
                                       else f"{used[1]} tokens of a tpm of {tokens} in {minutes} minute(s)"))
    assert codes.count(200) >= 1
    if limit == "budget":
        assert used[0] <= spend
        assert project_counter(root, project)[0] == used[0]  # the counter matches the usage rows
    else:
        assert used[1] <= tokens * minutes


def project_use(root, project):
    """(micro-units, tokens) the usage rows of a project add up to."""
    with sqlite3.connect(root / "llmgw.db") as db:
        cost, tokens = db.execute(
            "SELECT SUM(u.cost), SUM(u.prompt_tokens + u.completion_tokens) FROM usage u "
            "JOIN project p ON p.id = u.project_id WHERE p.name = ?", (project,)).fetchone()
    return (cost or 0, tokens or 0)


def project_held(root, project):
    """What a project's budget and tpm counters hold reserved."""
    with sqlite3.connect(root / "llmgw.db") as db:
        return tuple(db.execute(
            "SELECT COALESCE(SUM(CASE WHEN c.kind = 'budget' THEN c.reserved END), 0), "
            "COALESCE(SUM(CASE WHEN c.kind = 'tpm' THEN c.reserved END), 0) FROM counter c "
            "JOIN project p ON p.id = c.scope_id WHERE c.scope_kind = 'project' AND p.name = ?",
            (project,)).fetchone())


def money(micros):
    return f"{micros // 1_000_000}.{micros % 1_000_000:06d}"


def project_spend(root, project):
    """Micro-units the usage rows of a project add up to."""
    with sqlite3.connect(root / "llmgw.db") as db:
        got = db.execute("SELECT SUM(u.cost) FROM usage u JOIN project p ON p.id = u.project_id "
                         "WHERE p.name = ?", (project,)).fetchone()[0]
    return got or 0


def project_counter(root, project):
    """(used, reserved) micro-units of a project's all-time budget counter."""
    with sqlite3.connect(root / "llmgw.db") as db:
        return db.execute("SELECT SUM(c.used), SUM(c.reserved) FROM counter c JOIN project p "
                          "ON p.id = c.scope_id WHERE c.kind = 'budget' AND c.scope_kind = 'project' "
                          "AND c.slot = 'all' AND p.name = ?", (project,)).fetchone()


def test_a_worker_killed_mid_stream_is_recovered_its_leases_released_and_its_stream_billed(plane):
    """SIGKILL the gunicorn worker relaying a stream: within a minute another worker releases
    what the dead one leased and bills the stream for what it had relayed by its last beat."""
    import http.client
    root = plane["root"]
    cli(root, "project-create", "killed", "--team", "default")
    key = cli(root, "keys", "create", "--project", "killed").stdout.strip()
    cli(root, "limits", "set", "--project", "killed", "--budget", "1000", "--tpm", "10000000",
        "--period", "never")
    time.sleep(1.5)  # workers read limits at most once a second
    host, port = plane["url"].removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/v1/chat/completions", headers={
        "Authorization": f"Bearer {key}", "Content-Type": "application/json"}, body=json.dumps(
        {"model": "demo", "max_tokens": 400, "stream": True,  # 20 s at 50 ms a token
         "messages": [{"role": "user", "content": "go"}]}))
    resp = conn.getresponse()
    request_id = resp.getheader("X-Request-Id")
    received = 0
    while received < 30:
        if b'"content"' in resp.readline():
            received += 1

    def beat_shows_it():  # its worker's last beat has it in flight with what it relayed
        with sqlite3.connect(root / "llmgw.db") as db:
            for worker, inflight in db.execute("SELECT id, inflight FROM gateway_worker"):
                for entry in json.loads(inflight):
                    if entry["id"] == request_id and entry["completion"] >= 20:
                        return worker, entry["completion"]
        return None
    worker, snapshot = wait_for("a beat with the stream in flight", beat_shows_it, timeout=10, every=0.2)
    local = conn.sock.getsockname()[1]
    owner = subprocess.run(["ss", "-Htnp", "state", "established", "dst", f"127.0.0.1:{local}"],
                           capture_output=True, text=True).stdout
    pid = int(re.search(r"pid=(\d+)", owner).group(1))
    assert f"-{pid}-" in worker  # the worker that beats for it is the one relaying it
    os.kill(pid, 9)
    try:
        while resp.readline():
            received += 1
    except (OSError, http.client.HTTPException):
        pass  # the connection broke with the worker
    conn.close()

    def recovered():
        with sqlite3.connect(root / "llmgw.db") as db:
            row = db.execute("SELECT completion_tokens, status FROM usage WHERE request_id = ?",
                             (request_id,)).fetchone()
            held = db.execute("SELECT COALESCE(SUM(c.reserved), 0) FROM counter c JOIN project p ON "
                              "p.id = c.scope_id WHERE c.scope_kind = 'project' AND p.name = 'killed'"
                              ).fetchone()[0]
            leases = db.execute("SELECT COUNT(*) FROM lease WHERE worker = ?", (worker,)).fetchone()[0]
            alive = db.execute("SELECT COUNT(*) FROM gateway_worker WHERE id = ?", (worker,)).fetchone()[0]
        return row and held == 0 and leases == 0 and alive == 0 and row
    started = time.monotonic()
    completion, status = wait_for("the dead worker's recovery", recovered, timeout=60, every=0.5)
    print(f"recovered {time.monotonic() - started:.1f} s after the kill; billed {completion} of "
          f"{received} tokens received (the last beat had {snapshot})")
    assert status == 502 and snapshot <= completion <= received


def _engine(root, model="demo"):
    with sqlite3.connect(root / "llmgw.db") as db:
        return db.execute("SELECT r.endpoint FROM replica r JOIN model m ON m.id = r.model_id "
                          "WHERE m.name = ? AND r.state = 'ready'", (model,)).fetchone()[0]


def _processing(root, engine):
    text = requests.get(engine + "/metrics", headers=engine_auth(root, engine), timeout=5).text
    return int(re.search(r"requests_processing (\d+)", text).group(1))


def test_a_whole_answer_whose_client_leaves_stops_the_engine_and_bills_the_prompt(plane):
    import socket as sockets
    root, engine = plane["root"], _engine(plane["root"])
    host, port = plane["url"].removeprefix("http://").split(":")
    body = json.dumps({"model": "demo", "max_tokens": 400,  # 20 s of generation, not streamed
                       "messages": [{"role": "user", "content": "leave me"}]}).encode()
    client = sockets.create_connection((host, int(port)))
    client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                   + f"Authorization: Bearer {plane['key']}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                   + body)
    wait_for("the engine to work on it", lambda: _processing(root, engine) == 1, timeout=10, every=0.1)
    client.close()
    started = time.monotonic()
    wait_for("the engine to stop generating", lambda: _processing(root, engine) == 0, timeout=10, every=0.1)
    print(f"the engine stopped {time.monotonic() - started:.1f} s after the client left "
          f"(its answer would have taken 20 s)")
    log = root / "node" / "logs" / "llmgw-demo-0.log"
    assert "client went away before the answer" in log.read_text()

    def billed():
        with sqlite3.connect(root / "llmgw.db") as db:
            return db.execute("SELECT prompt_tokens, completion_tokens FROM usage WHERE status = 499 "
                              "AND completion_tokens = 0 ORDER BY id DESC LIMIT 1").fetchone()
    prompt, completion = wait_for("its usage row", billed, timeout=10, every=0.1)
    assert prompt > 0 and completion == 0  # the engine read its prompt


def test_metrics_add_up_every_worker_and_move_with_the_openai_clients_requests(plane):
    """/metrics of 4 gunicorn workers, parsed by prometheus_client's own parser: the request
    counter and the latency histograms move by exactly the requests made, which more than one
    worker answered; the reconciler's passes and node commands are there too."""
    import concurrent.futures
    import shutil
    import tempfile
    import tomllib
    import openai
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector
    from prometheus_client.parser import text_string_to_metric_families
    root = plane["root"]
    token = tomllib.loads((root / "server.toml").read_text())["metrics"]["token"]
    assert len(token) >= 24  # init wrote one
    assert requests.get(plane["url"] + "/metrics", timeout=10).status_code == 401

    def scrape():
        r = requests.get(plane["url"] + "/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/plain")
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(r.text) for s in fam.samples}

    def moved(after, before, name, **labels):
        at = (name, tuple(sorted(labels.items())))
        return after.get(at, 0) - before.get(at, 0)
    cli(root, "project-create", "watched", "--team", "default")
    key = cli(root, "keys", "create", "--project", "watched").stdout.strip()
    client = openai.OpenAI(base_url=plane["url"] + "/v1", api_key=key, max_retries=0)
    before = scrape()

    def one(i):
        messages = [{"role": "user", "content": f"metrics {i} 指標 📈"}]
        if i % 2:
            return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="demo", messages=messages, max_tokens=4, stream=True) if c.choices)
        return client.chat.completions.create(model="demo", messages=messages, max_tokens=4).usage.completion_tokens
    with concurrent.futures.ThreadPoolExecutor(20) as pool:
        list(pool.map(one, range(40)))
    ok = dict(model="demo", project="watched", status="200")
    after = wait_for("40 requests counted", lambda: (lambda a: moved(a, before, "llmgw_requests_total", **ok) >= 40 and a)(
        scrape()), timeout=30, every=0.2)
    assert moved(after, before, "llmgw_requests_total", **ok) == 40
    assert moved(after, before, "llmgw_tokens_total", model="demo", project="watched", kind="completion") == 160
    assert moved(after, before, "llmgw_request_duration_seconds_count", model="demo") >= 40
    assert moved(after, before, "llmgw_time_to_first_token_seconds_count", model="demo") >= 20
    assert after[("llmgw_request_duration_seconds_bucket", (("le", "+Inf"), ("model", "demo")))] >= 40
    assert after[("llmgw_replicas", (("model", "demo"), ("state", "ready")))] == 1
    assert after[("llmgw_reconciler_pass_duration_seconds_count", ())] > 0
    assert after[("llmgw_ssh_commands_total", (("node", "local"), ("outcome", "ok")))] > 0
    # More than one worker answered: each worker's own file holds a part of the 40.
    parts = []
    for f in (root / "metrics" / "web").glob("counter_*.db"):
        with tempfile.TemporaryDirectory() as one_dir:
            shutil.copy(f, one_dir)
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=one_dir)
            parts.append(sum(s.value for fam in registry.collect() for s in fam.samples
                             if s.name == "llmgw_requests_total" and s.labels.get("project") == "watched"))
    print(f"requests of project watched per worker file: {sorted(parts)}")
    assert sum(parts) == 40 and sum(1 for p in parts if p) >= 2, parts


def test_stopping_the_gateway_ends_a_long_stream_with_an_error_event_and_bills_it(plane):
    """Runs last: it stops the module's control plane. gateway.shutdown_grace is 3 s here."""
    r = stream(plane, 400)  # 20 s at 50 ms a token
    request_id = r.headers["X-Request-Id"]
    lines = r.iter_lines()
    received = 0
    def token(line):  # an event with generated text (not the first, empty one)
        return b'"content"' in line and b'"content": ""' not in line
    for line in lines:
        if token(line):
            received += 1
            if received == 5:
                break
    stopped = time.monotonic()
    os.killpg(plane["proc"].pid, signal.SIGTERM)  # as systemd stops it
    rest = list(lines)  # a chunked body cut off without its end would raise here
    errors = [json.loads(line[6:])["error"] for line in rest if line.startswith(b'data: {"error"')]
    received += sum(1 for line in rest if token(line))
    assert errors and errors[0]["code"] == "gateway_shutdown", rest[-3:]
    assert "gateway.shutdown_grace" in errors[0]["message"]
    plane["proc"].wait(timeout=60)
    print(f"the control plane exited {time.monotonic() - stopped:.1f} s after SIGTERM; the stream had {received} tokens")
    with sqlite3.connect(plane["root"] / "llmgw.db") as db:
        status, completion = db.execute("SELECT status, completion_tokens FROM usage WHERE request_id = ?",
                                        (request_id,)).fetchone()
        held = db.execute("SELECT COALESCE(SUM(reserved), 0) FROM counter").fetchone()[0]
        workers = db.execute("SELECT COUNT(*) FROM gateway_worker").fetchone()[0]
    assert (status, completion) == (503, received)
    assert held == 0 and workers == 0  # every worker gave back its slices and left
