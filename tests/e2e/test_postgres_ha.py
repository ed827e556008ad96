"""Two control planes on one real PostgreSQL: budgets and rpm exact across both (each with
two gunicorn workers), one reconciler leading, and the other taking over when the leader's
machine dies — adopting the engine it left running instead of starting a second one."""
import os
import re
import shutil
import signal
import time

import pytest
import requests

from tests.conftest import free_port, free_port_range
from tests.e2e.conftest import ControlPlane, cli, fire_streams, wait_for
from tests.harness import pg as pgharness

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    reason = pgharness.missing_reason()
    if reason:
        pytest.skip(reason)
    with pgharness.PostgresServer(tmp_path_factory.mktemp("pg")) as server:
        yield server


def _set(root, old, new):
    path = root / "server.toml"
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


@pytest.fixture(scope="module")
def planes(pg, tmp_path_factory):
    url = pg.create_database("ha")
    work = tmp_path_factory.mktemp("ha")
    a_root, b_root = work / "a", work / "b"
    a_port, b_port, base = free_port(), free_port(), free_port_range(20)
    cli(a_root, "init", "--listen", f"127.0.0.1:{a_port}")
    _set(a_root, 'url = ""', f'url = "{url}"')
    _set(a_root, "interval = 5", f'interval = 1\nport_range = "{base}-{base + 20}"')
    _set(a_root, "[server]", "[server]\nworkers = 2")
    # What an operator does for a second control plane: the same config (secret key
    # included, so sessions hold on both) and the same secrets directory, another address.
    shutil.copytree(a_root, b_root, ignore=shutil.ignore_patterns("*.log", "*.lock"))
    _set(b_root, f"127.0.0.1:{a_port}", f"127.0.0.1:{b_port}")
    cli(a_root, "init")  # migrates PostgreSQL (a second init finds it done)
    cli(b_root, "init")
    cli(a_root, "demo", "--no-serve", "--listen", f"127.0.0.1:{a_port}")
    cli(a_root, "model", "add", "demo", "--engine", "sim", "--replicas", "1", "--arg=--token-delay",
        "--arg=0.05")
    key = cli(a_root, "keys", "create").stdout.strip()
    cli(a_root, "prices", "set", "demo", "--prompt", "0", "--completion", "1")  # 0.001 a token
    a, b = ControlPlane(a_root, a_port), ControlPlane(b_root, b_port)
    try:
        a.start()
        b.start()
        for plane in (a, b):
            wait_for(f"a chat answer through {plane.url}", lambda: _chat(plane.url, key) == 200,
                     timeout=90, every=0.5)
        wait_for("both answers to be settled", lambda: int(pg.sql(
            "SELECT COUNT(*) FROM usage WHERE status = 200", database="ha")) >= 2, timeout=10, every=0.1)
        yield {"a": a, "b": b, "key": key, "pg": pg, "url": url}
    finally:
        for plane in (a, b):
            plane.stop()
        for pidfile in (a_root / "node" / "run").glob("llmgw-*.pid"):
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass


def _chat(url, key, max_tokens=1):
    try:
        return requests.post(url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                             json={"model": "demo", "max_tokens": max_tokens, "messages": []},
                             timeout=10).status_code
    except requests.RequestException:
        return None


def _fire(planes):
    """50 concurrent streams, every other one through each control plane."""
    return fire_streams([planes["b"].url, planes["a"].url], planes["key"])


def _budget(planes):
    """(spent, held) by the default project for ever, in the currency (micro-units scaled)."""
    out = planes["pg"].sql("SELECT COALESCE(SUM(c.used), 0), COALESCE(SUM(c.reserved), 0) FROM counter c "
                           "JOIN project p ON p.id = c.scope_id WHERE c.kind = 'budget' AND "
                           "c.scope_kind = 'project' AND c.slot = 'all' AND p.name = 'default'",
                           database="ha")
    used, reserved = out.split("|")
    return int(used) / 1_000_000, int(reserved) / 1_000_000


def _leaders(planes):
    return {name for name in ("a", "b")
            if re.search(r"leading: pid \d+ holds the advisory lock",
                         (planes[name].root / "serve.log").read_text())}


def test_one_reconciler_leads_and_the_other_stands_by(planes):
    wait_for("one leader", lambda: len(_leaders(planes)) == 1, timeout=30)
    held = planes["pg"].sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
                            database="ha")
    assert held == "1"
    standby = ({"a", "b"} - _leaders(planes)).pop()
    assert "another reconciler leads" in (planes[standby].root / "serve.log").read_text()


def test_a_budget_for_ten_admits_ten_of_fifty_across_two_control_planes(planes):
    def settled():  # the warm-up requests: counter and usage rows go in one transaction
        used, reserved = _budget(planes)
        total = planes["pg"].sql("SELECT COALESCE(SUM(u.cost), 0) FROM usage u JOIN project p ON "
                                 "p.id = u.project_id WHERE p.name = 'default'", database="ha")
        return reserved == 0 and used == int(total) / 1_000_000 and (used,)
    spent_before = wait_for("earlier requests to be settled", settled, timeout=10, every=0.1)[0]
    cli(planes["a"].root, "limits", "set", "--project", "default", "--budget",
        f"{spent_before + 0.1:.6f}", "--period", "never")
    time.sleep(1.5)  # workers read limits at most once a second
    results = _fire(planes)
    ok = [(side, body) for side, status, body in results if status == 200]
    refused = [body for _, status, body in results if status == 429]
    assert len(ok) == 10 and len(refused) == 40, [r[:2] for r in results if r[1] not in (200, 429)]
    assert all(body.rstrip().endswith("data: [DONE]") for _, body in ok)
    assert all("insufficient_quota" in body for body in refused)
    used, reserved = wait_for("both control planes to settle", lambda: (
        c := _budget(planes))[1] == 0 and c, timeout=10, every=0.1)
    assert used - spent_before == pytest.approx(0.1, abs=1e-9)
    cli(planes["a"].root, "limits", "set", "--project", "default", "--budget", "0")


def test_an_rpm_of_ten_admits_ten_of_fifty_across_two_control_planes(planes):
    # A project of its own: the requests of the tests before count in its window otherwise.
    # The window slides, so when the minute turns during the fifty does not matter.
    cli(planes["b"].root, "project-create", "rpm-ten", "--team", "default")
    key = cli(planes["b"].root, "keys", "create", "--project", "rpm-ten").stdout.strip()
    cli(planes["b"].root, "limits", "set", "--project", "rpm-ten", "--rpm", "10")
    time.sleep(1.5)
    codes = [status for _, status, _ in fire_streams([planes["b"].url, planes["a"].url], key)]
    assert codes.count(200) == 10 and codes.count(429) == 40, codes


def test_the_standby_takes_over_when_the_leader_dies_and_adopts_its_engine(planes):
    wait_for("one leader", lambda: len(_leaders(planes)) == 1, timeout=30)
    first = _leaders(planes).pop()
    second = "b" if first == "a" else "a"
    engine_pid = int(next((planes["a"].root / "node" / "run").glob("llmgw-*.pid")).read_text())
    planes[first].stop(signal.SIGKILL)  # its gunicorn and reconciler die without a word
    wait_for("the standby to lead", lambda: second in _leaders(planes), timeout=30, every=0.5)
    # The new leader's passes see the running engine as the replica's, not a stranger to replace.
    time.sleep(4)
    assert planes["pg"].sql("SELECT state FROM replica", database="ha") == "ready"
    assert int(next((planes["a"].root / "node" / "run").glob("llmgw-*.pid")).read_text()) == engine_pid
    os.kill(engine_pid, 0)
    assert _chat(planes[second].url, planes["key"]) == 200
    planes[first].start()  # back, as the standby now
    wait_for("the old leader to stand by", lambda: "another reconciler leads" in
             (planes[first].root / "serve.log").read_text().rsplit("llmgw serving on", 1)[-1],
             timeout=30)


def test_a_leader_whose_lock_connection_breaks_stops_and_one_leads_again(planes):
    before = {n: (planes[n].root / "serve.log").read_text().count("leading: pid") for n in ("a", "b")}
    engine_pid = int(next((planes["a"].root / "node" / "run").glob("llmgw-*.pid")).read_text())
    # What a network cut looks like from the database's side: the session holding the lock ends.
    assert planes["pg"].sql("SELECT count(pg_terminate_backend(pid)) FROM pg_locks "
                            "WHERE locktype = 'advisory' AND granted", database="ha") == "1"
    wait_for("the leader to notice", lambda: any(
        "lost the lead" in (planes[n].root / "serve.log").read_text() for n in ("a", "b")), timeout=20)
    wait_for("a leader again", lambda: sum(
        (planes[n].root / "serve.log").read_text().count("leading: pid") for n in ("a", "b"))
        == sum(before.values()) + 1, timeout=30, every=0.5)
    held = planes["pg"].sql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted",
                            database="ha")
    assert held == "1"
    time.sleep(3)
    assert int(next((planes["a"].root / "node" / "run").glob("llmgw-*.pid")).read_text()) == engine_pid
    assert _chat(planes["a"].url, planes["key"]) == 200 and _chat(planes["b"].url, planes["key"]) == 200


def test_with_the_database_stopped_known_keys_are_served_and_usage_is_settled_once_after(planes):
    """PostgreSQL stopped for 30 s under load through both control planes: the unlimited key and
    a key whose budget slice lasts are served; a key whose budget is near its end (each request
    is leased by itself) gets a clear 503; afterwards every answer is one usage row."""
    import concurrent.futures
    root, pg = planes["a"].root, planes["pg"]
    keys = {"unlimited": planes["key"]}
    for name, budget in (("roomy", "1000"), ("tight", "0.05")):  # 0.05: room for 50 of 0.001
        cli(root, "project-create", name, "--team", "default")
        keys[name] = cli(root, "keys", "create", "--project", name).stdout.strip()
        cli(root, "limits", "set", "--project", name, "--budget", budget, "--period", "never")
    time.sleep(1.5)  # workers read limits at most once a second
    got = []  # (key name, status, request id, error code)

    def one(i, names=("unlimited", "roomy", "tight")):
        name = names[i % len(names)]
        url = (planes["a"].url, planes["b"].url)[(i // 3) % 2]
        try:
            r = requests.post(url + "/v1/chat/completions", timeout=20,
                              headers={"Authorization": f"Bearer {keys[name]}"},
                              json={"model": "demo", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]})
        except requests.RequestException as e:
            return name, None, None, str(e)
        code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
        return name, r.status_code, r.headers.get("X-Request-Id"), code
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # So that every worker sees every key; the tight budget has room for only 50.
        warm = list(pool.map(lambda i: one(i, ("unlimited", "roomy", "unlimited", "roomy", "tight")
                                           if i < 20 else ("unlimited", "roomy")), range(240)))
    assert all(status == 200 for _, status, _, _ in warm), warm
    pg.stop()
    stopped = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            i = 0
            while time.monotonic() - stopped < 30:
                got += pool.map(one, range(i, i + 24))
                i += 24
    finally:
        pg.resume()
    by = {name: [g for g in got if g[0] == name] for name in keys}
    for name in ("unlimited", "roomy"):
        # A worker that never saw a key cannot check it: that is a 503 too, never anything else.
        served = sum(1 for _, status, _, _ in by[name] if status == 200)
        assert all(status == 200 or (status == 503 and code == "database_unavailable")
                   for _, status, _, code in by[name]), by[name][:5]
        assert served >= 0.75 * len(by[name]), (name, served, len(by[name]))
    assert by["tight"] and all(status == 503 and code == "database_unavailable"
                               for _, status, _, code in by["tight"]), by["tight"][:5]
    answered = {rid for _, status, rid, _ in warm + got if status == 200}
    print("while PostgreSQL was stopped, served of sent: " + ", ".join(
        f"{name} {sum(1 for g in by[name] if g[1] == 200)} of {len(by[name])}" for name in keys))

    def settled():
        rows = pg.sql("SELECT request_id FROM usage WHERE status = 200", database="ha").split()
        return set(rows) >= answered and rows
    rows = wait_for("the usage to be settled", settled, timeout=90, every=1)
    assert len(rows) == len(set(rows))  # once each
    held = pg.sql("SELECT COALESCE(SUM(c.reserved), 0) FROM counter c JOIN project p ON "
                  "p.id = c.scope_id WHERE c.scope_kind = 'project' AND p.name = 'tight'", database="ha")
    assert held == "0"
