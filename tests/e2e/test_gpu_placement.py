"""GPU placement on a real fleet: which cards each replica gets, what its engine is told, and why
a node says no.

Three sshd nodes: gpu-a (systemd as PID 1) with eight H100s of which GPU 3 counts uncorrected
ECC errors, gpu-b (the setsid fallback) with four L4s and a stand-in vLLM, and cpu-c with no GPU.
A GPU node has a loaded NVIDIA driver as discovery sees one and an nvidia-smi printing a
recorded sample from a file, which a test rewrites to make a card sick. llama.cpp's CUDA build
is installed on the GPU nodes (the tarball holds the CPU llama-server, which ignores -ngl and
serves a tiny GGUF all the same); the vLLM stand-in records how it was started and serves the
OpenAI API with llmgw's simulated engine.
"""
import html
import json
import re
from html.parser import HTMLParser

import openai
import pytest
import requests

from tests.conftest import TOP, free_port
from tests.e2e.conftest import (CACHE, VERSION, ControlPlane, cli, configure, need_test_nodes,
                                nodes_json, operator_key, tune, wait_for)
from tests.e2e.test_fleet import CUDA, CUDART, X64, cudart_tarball, fake_nvidia
from tests.harness import browser
from tests.harness import nodes as harness
from tests.harness.engine_keys import engine_auth

pytestmark = pytest.mark.e2e

SUBNET = "10.250.8"
ADMIN = "ops@example.com"
CASES = TOP / "tests" / "cases" / "gpus"
SAMPLE = "/etc/llmgw-test/nvidia-smi.out"
NVIDIA_SMI = f'#!/bin/sh\nexec cat {SAMPLE}\n'
VLLM = "/opt/vllm/bin/vllm"
VL_DIR = "/srv/models/vl"
# How vLLM is started is what matters here: the stand-in writes its argv (one per line), whether
# it got VLLM_API_KEY and the cards it was given to /var/lib/vllm-shim/PORT.argv, then serves
# with the simulated engine, which demands that key as vLLM does.
VLLM_SHIM = """#!/bin/sh
if [ "$1" = --version ]; then echo 0.11.2; exit 0; fi
[ "$1" = serve ] || { echo "this vllm knows only --version and serve" >&2; exit 2; }
name=; host=; port=; prev=
for arg in "$@"; do
  case "$prev" in
    --served-model-name) name=$arg ;;
    --host) host=$arg ;;
    --port) port=$arg ;;
  esac
  prev=$arg
done
mkdir -p /var/lib/vllm-shim
{ printf '%s\\n' "$@"; echo "VLLM_API_KEY=${VLLM_API_KEY:+set}"; echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES";
  echo "CUDA_DEVICE_ORDER=$CUDA_DEVICE_ORDER"; echo "LLMGW_GPU_UUIDS=$LLMGW_GPU_UUIDS"; } > /var/lib/vllm-shim/$port.argv
keys=/var/lib/vllm-shim/$port.key
(umask 077; printf '%s\\n' "$VLLM_API_KEY" > "$keys")
exec python3 /opt/vllm/sim_engine.py --model "$name" --host "$host" --port "$port" --api-key-file "$keys"
"""
# The real llama-server on two cores: one thread each, a small context.
LLAMA_ARGS = ("--arg=-t", "--arg=1", "--arg=-tb", "--arg=1", "--arg=-c", "--arg=512")


def sample(name):
    return json.loads((CASES / name).read_text())["output"]


H100 = sample("h100x8-one-ecc.json")
L4 = sample("l4x4.json")


def uuids_of(text):
    """{index: uuid} of an nvidia-smi sample."""
    return {int(line.split(",")[0]): line.split(",")[1].strip() for line in text.splitlines() if line}


def with_ecc_errors(text, errors):
    """The sample with these cards' uncorrected ECC counts changed: {uuid: count}."""
    lines = []
    for line in text.splitlines():
        fields = line.split(", ")
        if fields[1] in errors:
            fields[-1] = str(errors[fields[1]])
        lines.append(", ".join(fields))
    return "\n".join(lines) + "\n"


SICK = uuids_of(H100)[3]  # GPU 3: 12 uncorrected ECC errors in the sample
HEALTHY_H100 = set(uuids_of(H100).values()) - {SICK}
L4_UUIDS = set(uuids_of(L4).values())


def swap_sample(node, text):
    """Give nvidia-smi another sample at once (a half-written file would lose cards)."""
    node.write_file(SAMPLE + ".new", text)
    result = node.exec(["mv", SAMPLE + ".new", SAMPLE])
    assert result.returncode == 0, result.stderr


def fake_gpus(node, text):
    """A loaded NVIDIA driver, and an nvidia-smi that prints the sample in SAMPLE."""
    fake_nvidia(node)
    node.write_file(SAMPLE, text)
    node.write_file("/usr/local/bin/nvidia-smi", NVIDIA_SMI, mode=0o755)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    from tests.harness.tiny_gguf import write_tiny_gguf

    work = tmp_path_factory.mktemp("gpus")
    tarball = llama_server_tarball(CACHE)
    operator, pub = operator_key(work)
    env = {"work": work}
    with FakeGitHub() as github, \
            harness.NodeCluster(work / "nodes", [pub], subnet_prefix=SUBNET) as cluster:
        github.add_release(VERSION, {X64: tarball, CUDA: tarball, CUDART: cudart_tarball(work)})
        booted = [cluster.add("gpu-a", systemd=True, wait=False), cluster.add("gpu-b", wait=False),
                  cluster.add("cpu-c", wait=False)]
        for node in booted:
            node.wait_ready(60)
            env[node.name] = node
        fake_gpus(env["gpu-a"], H100)
        fake_gpus(env["gpu-b"], L4)
        env["gpu-b"].write_file(VLLM, VLLM_SHIM, mode=0o755)
        env["gpu-b"].write_file("/opt/vllm/sim_engine.py",
                                (TOP / "llmgw" / "scripts" / "sim_engine.py").read_text())
        env["gpu-b"].write_file(f"{VL_DIR}/config.json", '{"architectures": ["LlamaForCausalLM"]}\n')

        root = env["root"] = work / "cp"
        init = cli(root, "init", "--admin", ADMIN)
        env["password"] = re.search(r"password: (\S+)", init.stdout).group(1)
        plane = env["plane"] = ControlPlane(root, free_port())
        configure(root, github, listen=f"127.0.0.1:{plane.port}", interval=1)
        tune(root, "reconciler", gpu_check_interval=1)
        with open(root / "server.toml", "a") as toml:
            toml.write(f'\n[node_engines.gpu-b]\nvllm = "{VLLM}"\n')
        for node in booted:
            cli(root, "add-node", node.name, "--addr", node.ip, "--bootstrap-key", str(operator))
        env["tiny"] = str(write_tiny_gguf(work / "tiny.gguf"))
        env["key"] = cli(root, "keys", "create", "--project", "default").stdout.strip()
        try:
            plane.start()
            wait_for("llama.cpp on every node and vLLM on gpu-b", lambda: engines_ready(root), 240)
            yield env
        finally:
            plane.stop()


def engines_ready(root):
    ready = {(name, i["engine"]) for name, n in nodes_json(root).items()
             for i in n["installs"] if i["state"] == "ready"}
    wanted = {("gpu-a", "llamacpp"), ("gpu-b", "llamacpp"), ("cpu-c", "llamacpp"), ("gpu-b", "vllm")}
    return wanted <= ready


def replicas_of(root, model):
    return json.loads(cli(root, "model", "show", model, "--json").stdout)["replica_rows"]


def wait_ready(root, model, count, timeout=180, until=lambda rows: True):
    """Wait until the model has count replicas, all ready (and until(rows) holds); return them."""
    def check():
        rows = replicas_of(root, model)
        done = len(rows) == count and all(r["state"] == "ready" for r in rows) and until(rows)
        return rows if done else None
    try:
        return wait_for(f"{count} ready replica(s) of {model}", check, timeout=timeout)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{cli(root, 'explain', model).stdout}") from None


def cards_by_uuid(root):
    """{uuid: the card as `nodes --json` shows it, with its node's name}."""
    return {g["uuid"]: dict(g, node=name) for name, n in nodes_json(root).items() for g in n["gpus"]}


def flag(argv, name):
    """The value that follows a flag in an argv."""
    assert name in argv, argv
    return argv[argv.index(name) + 1]


def unit_environment(node, unit):
    out = node.exec(["systemctl", "show", unit, "-p", "Environment", "--value"]).stdout
    return set(out.split())


def main_pid_argv(node, unit):
    pid = node.exec(["systemctl", "show", unit, "-p", "MainPID", "--value"]).stdout.strip()
    return node.read_bytes(f"/proc/{pid}/cmdline").decode().split("\0")


def admin_session(env):
    """A requests session logged in as the administrator `init` made."""
    base, s = env["plane"].url, requests.Session()
    token = re.search(r'name="csrf_token" value="([^"]+)"', s.get(base + "/login").text).group(1)
    resp = s.post(base + "/login", data={"email": ADMIN, "password": env["password"],
                                         "csrf_token": token}, allow_redirects=False)
    assert resp.status_code == 302, resp.text
    return s


def page(env, path):
    resp = admin_session(env).get(env["plane"].url + path)
    assert resp.status_code == 200, f"{path}: {resp.status_code}\n{resp.text[:2000]}"
    return resp.text


class _TableRows(HTMLParser):
    """The text of each cell of every <tr id=…> in the <table class=…> asked for."""

    def __init__(self, table_class):
        super().__init__()
        self.table_class, self.inside = table_class, False
        self.rows, self.row, self.cell = {}, None, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table" and self.table_class in (attrs.get("class") or "").split():
            self.inside = True
        elif self.inside and tag == "tr" and attrs.get("id"):
            self.row = self.rows[attrs["id"]] = []
        elif self.row is not None and tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.cell is not None:
            self.row.append(" ".join("".join(self.cell).split()))
            self.cell = None
        elif tag == "tr":
            self.row = None
        elif tag == "table":
            self.inside = False

    def handle_data(self, data):
        if self.cell is not None:
            self.cell.append(data)


def events(text):
    """The lines under "What happened to this node" on a node page, newest first."""
    listing = re.search(r'<ul class="events">(.*?)</ul>', text, re.S).group(1)
    items = re.findall(r"<li>(.*?)</li>", listing, re.S)
    undated = (re.sub(r'<span class="ts">[^<]*</span>', "", item) for item in items)
    return [html.unescape(text).strip() for text in undated]


def table_rows(text, table_class):
    parser = _TableRows(table_class)
    parser.feed(text)
    return parser.rows


def test_a_two_card_model_gets_two_healthy_h100s_and_its_engine_sees_only_those(fleet):
    root, node = fleet["root"], fleet["gpu-a"]
    cli(root, "model", "add", "pair", "--file", fleet["tiny"], "--gpus", "2",
        "--gpu-class", "h100-80g", *LLAMA_ARGS)
    (pair,) = wait_ready(root, "pair", 1)
    assert pair["node"] == "gpu-a"
    assert len(pair["gpu_uuids"]) == 2 and set(pair["gpu_uuids"]) <= HEALTHY_H100, pair
    assert SICK not in pair["gpu_uuids"]

    env = unit_environment(node, "llmgw-pair-0")
    assert f"CUDA_VISIBLE_DEVICES={','.join(pair['gpu_uuids'])}" in env, env
    assert "CUDA_DEVICE_ORDER=PCI_BUS_ID" in env, env
    argv = main_pid_argv(node, "llmgw-pair-0")
    assert flag(argv, "-ngl") == "999" and flag(argv, "--tensor-split") == "1,1", argv


def test_one_card_replicas_spread_over_both_gpu_nodes_and_never_share_a_card(fleet):
    root = fleet["root"]
    cli(root, "model", "add", "r3", "--file", fleet["tiny"], "--replicas", "3", "--gpus", "1",
        "--min-gpu-memory", "20G", *LLAMA_ARGS)
    rows = wait_ready(root, "r3", 3)
    assert {r["node"] for r in rows} == {"gpu-a", "gpu-b"}, rows
    assert all(len(r["gpu_uuids"]) == 1 for r in rows), rows
    held = [u for m in json.loads(cli(root, "models", "--json").stdout)
            for r in m["replica_rows"] for u in r["gpu_uuids"]]
    assert len(held) == len(set(held)) == 5, held
    assert SICK not in held


def test_a_cpu_model_runs_on_the_node_without_gpus_and_its_engine_sees_no_card(fleet):
    root, node = fleet["root"], fleet["cpu-c"]
    cli(root, "model", "add", "cpu", "--file", fleet["tiny"], *LLAMA_ARGS)
    (row,) = wait_ready(root, "cpu", 1)
    assert (row["node"], row["gpu_uuids"]) == ("cpu-c", [])
    pid = node.read_file("/opt/llmgw/run/llmgw-cpu-0.pid").strip()
    raw = node.read_bytes(f"/proc/{pid}/environ").split(b"\0")
    environ = dict(item.decode().split("=", 1) for item in raw if b"=" in item)
    assert environ["CUDA_VISIBLE_DEVICES"] == ""


def test_a_four_card_model_gets_the_one_replica_that_fits_and_says_why_not_the_other(fleet):
    root = fleet["root"]
    cli(root, "model", "add", "tp4", "--file", fleet["tiny"], "--replicas", "2", "--gpus", "4",
        "--gpu-class", "h100-80g", *LLAMA_ARGS)
    (row,) = wait_ready(root, "tp4", 1)
    assert row["node"] == "gpu-a" and set(row["gpu_uuids"]) <= HEALTHY_H100, row
    assert len(row["gpu_uuids"]) == 4

    explained = json.loads(cli(root, "explain", "tp4", "--json").stdout)
    assert explained["summary"].startswith("1 of 2 replicas placed"), explained
    reasons = {line["node"]: line["reason"] for line in explained["nodes"]}
    assert not any(line["ok"] for line in explained["nodes"]), explained
    assert re.search(r"\d+ of 7 healthy h100-80g free, 4 needed", reasons["gpu-a"]), reasons
    assert f"GPU 3 ({SICK}) is unhealthy: 12 uncorrected ECC errors" in reasons["gpu-a"], reasons
    assert "has l4-24g" in reasons["gpu-b"], reasons
    assert "no GPU" in reasons["cpu-c"], reasons


def test_a_replica_leaves_a_card_that_starts_counting_ecc_errors(fleet):
    root, node = fleet["root"], fleet["gpu-a"]
    (before,) = replicas_of(root, "pair")
    failing = before["gpu_uuids"][0]
    index = next(i for i, u in uuids_of(H100).items() if u == failing)
    # Every healthy H100 is claimed by now. GPU 3 has been reset (its count is back to 0) and
    # one of pair-0's cards starts counting instead, so there is exactly one place to go.
    cards = nodes_json(root)["gpu-a"]["gpus"]
    assert [g["index"] for g in cards if g["healthy"] and not g["claimed_by"]] == []
    swap_sample(node, with_ecc_errors(H100, {SICK: 0, failing: 4}))

    (after,) = wait_ready(root, "pair", 1, until=lambda rows: failing not in rows[0]["gpu_uuids"])
    assert after["node"] == "gpu-a" and len(after["gpu_uuids"]) == 2, after
    assert set(after["gpu_uuids"]) <= set(uuids_of(H100).values()) - {failing}
    env = unit_environment(node, "llmgw-pair-0")
    assert f"CUDA_VISIBLE_DEVICES={','.join(after['gpu_uuids'])}" in env, env
    card = cards_by_uuid(root)[failing]
    assert not card["healthy"] and card["reason"].startswith("4 uncorrected ECC errors"), card

    said = [e for e in events(page(fleet, "/nodes/gpu-a")) if e.startswith("stopped pair-0")]
    assert len(said) == 1, said
    assert said[0].startswith(f"stopped pair-0: GPU {index} ({failing}) on gpu-a is unhealthy: "
                              f"4 uncorrected ECC errors"), said
    assert said[0].endswith("; placed again on GPU " + ", ".join(map(str, after["gpu_indexes"])))


def test_vllm_is_started_with_its_cards_and_answers_through_the_gateway(fleet):
    root, node = fleet["root"], fleet["gpu-b"]
    cli(root, "model", "add", "vl", "--engine", "vllm", "--file", VL_DIR, "--on-nodes",
        "--gpus", "2", "--gpu-class", "l4-24g")
    (row,) = wait_ready(root, "vl", 1)
    assert row["node"] == "gpu-b" and len(row["gpu_uuids"]) == 2
    assert set(row["gpu_uuids"]) <= L4_UUIDS, row
    argv = node.read_file(f"/var/lib/vllm-shim/{row['port']}.argv").splitlines()
    assert argv[:2] == ["serve", VL_DIR], argv
    assert flag(argv, "--served-model-name") == "vl"
    assert flag(argv, "--tensor-parallel-size") == "2"
    # vLLM takes every CUDA_VISIBLE_DEVICES entry for a number, so it gets the claimed cards'
    # indexes in PCI bus order; the UUIDs travel beside them.
    assert argv[-3:] == [f"CUDA_VISIBLE_DEVICES={','.join(map(str, row['gpu_indexes']))}",
                         "CUDA_DEVICE_ORDER=PCI_BUS_ID",
                         f"LLMGW_GPU_UUIDS={','.join(row['gpu_uuids'])}"], argv
    # Its key came in VLLM_API_KEY, read from the replica's key file on the node: on no
    # command line, and the engine refuses whoever comes without it.
    key = engine_auth(root, row["endpoint"])["Authorization"].removeprefix("Bearer ")
    assert "VLLM_API_KEY=set" in argv and not any(key in a for a in argv)
    assert key not in node.exec(["ps", "-eo", "args"]).stdout
    assert requests.post(row["endpoint"] + "/v1/chat/completions", timeout=10, json={
        "model": "vl", "messages": [{"role": "user", "content": "hi"}]}).status_code == 401

    client = openai.OpenAI(base_url=fleet["plane"].url + "/v1", api_key=fleet["key"],
                           max_retries=0, timeout=30)
    reply = client.chat.completions.create(model="vl", max_tokens=4,
                                           messages=[{"role": "user", "content": "hello"}])
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 4


def test_the_model_page_shows_each_nodes_verdict_as_explain_says_it(fleet):
    reason = browser.missing_reason()
    if reason:
        pytest.skip(reason)
    root, base = fleet["root"], fleet["plane"].url
    said = {}
    for line in cli(root, "explain", "tp4").stdout.splitlines():
        m = re.match(r"  (\S+)\s+(yes|no)\s+(.*)$", line)
        if m:
            said[m.group(1)] = (m.group(2), m.group(3).strip())
    assert set(said) == {"gpu-a", "gpu-b", "cpu-c"}, said

    b = browser.Browser()
    try:
        b.get(base + "/login")
        b.type("input[name=email]", ADMIN)
        b.type("input[name=password]", fleet["password"])
        b.click("button[type=submit]")
        b.wait_for_text("gpu-a", css="#cluster")
        b.get(base + "/models/tp4")
        b.wait_for_text("cpu-c", css="table.verdicts")
        for node, (yes_no, why) in said.items():
            row = b.text(f"#verdict-{node}")
            assert node in row and yes_no in row.split(), row
            assert " ".join(b.text(f"#verdict-{node} td.reason").split()) == " ".join(why.split())
        b.screenshot(str(fleet["work"] / "model-tp4.png"))
    finally:
        b.close()


def test_fewer_replicas_and_a_removed_model_free_their_cards(fleet):
    root = fleet["root"]
    r3 = {r["name"]: r for r in replicas_of(root, "r3")}
    kept, freed = r3.pop("r3-0"), list(r3.values())
    out = cli(root, "model", "set", "r3", "--replicas", "1").stdout
    assert "changed model r3 (replicas)" in out

    def shrunk():
        cards = cards_by_uuid(root)
        return cards if all(cards[r["gpu_uuids"][0]]["claimed_by"] == [] for r in freed) else None
    cards = wait_for("r3-1 and r3-2 to let go of their cards", shrunk, timeout=60)
    assert cards[kept["gpu_uuids"][0]]["claimed_by"] == ["r3-0"]
    assert [r["name"] for r in replicas_of(root, "r3")] == ["r3-0"]
    for r in freed:
        card = table_rows(page(fleet, f"/nodes/{r['node']}"), "gpus")[f"gpu-{r['gpu_uuids'][0]}"]
        assert card[-1] == "free", card
    on_a = [r for r in freed if r["node"] == "gpu-a"]
    for r in on_a:  # its engine is stopped, not merely forgotten
        wait_for(f"llmgw-{r['name']} to stop", lambda: fleet["gpu-a"].exec(
            ["systemctl", "is-active", f"llmgw-{r['name']}"]).stdout.strip() != "active", 60)

    (tp4,) = replicas_of(root, "tp4")
    done = cli(root, "model", "remove", "tp4")
    # A reconciler runs: the replica leaves routing and is stopped once idle, then forgotten.
    assert "tp4: 1 replica(s) out of routing, finishing their requests" in done.stderr, done.stderr
    assert "removed model tp4; stopped 1 replica(s) once their requests were done" in done.stdout
    cards = cards_by_uuid(root)
    assert [cards[u]["claimed_by"] for u in tp4["gpu_uuids"]] == [[], [], [], []]
    assert fleet["gpu-a"].exec(["systemctl", "is-active", "llmgw-tp4-0"]).stdout.strip() != "active"
