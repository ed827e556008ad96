"""Real nodes at the edges: a CPU without AVX2, a library removed after install, hostile names."""
import re
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import (CACHE, VERSION, cli, configure, need_test_nodes, nodes_json,
                                operator_key, tune)
from tests.harness import nodes as harness

pytestmark = pytest.mark.e2e
ASSET = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"
HOSTILE_DIR = "/opt/llm gw/it's $(touch /tmp/pwned-dir)"
HOSTILE_MODEL = "tiny;$(touch${IFS}/tmp/pwned-model)`touch${IFS}/tmp/pwned-tick`"


def cpuinfo_without_avx2():
    text = open("/proc/cpuinfo").read()
    return re.sub(r"\b(avx2|avx512\w*)\b", "", text)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    from tests.harness.tiny_gguf import write_tiny_gguf
    work = tmp_path_factory.mktemp("edges")
    operator, pub = operator_key(work)
    with FakeGitHub() as github, harness.NodeCluster(
            work / "nodes", [pub],
            subnet_prefix="10.250.2") as nodes:
        github.add_release(VERSION, {ASSET: llama_server_tarball(CACHE)})
        old = nodes.add("oldcpu", cpuinfo=cpuinfo_without_avx2())
        odd = nodes.add("odd")
        root = work / "cp"
        cli(root, "init")
        configure(root, github)
        tune(root, "reconciler", verify_interval=2)
        cli(root, "add-node", "oldcpu", "--addr", old.ip, "--bootstrap-key", str(operator))
        cli(root, "add-node", "odd", "--addr", odd.ip, "--bootstrap-key", str(operator),
            "--base-dir", HOSTILE_DIR)
        model = write_tiny_gguf(work / "tiny.gguf")
        cli(root, "model", "add", HOSTILE_MODEL, "--file", str(model), "--replicas", "2",
            "--arg=-t", "--arg=1", "--arg=-c", "--arg=256")
        proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw",
                                 "reconcile", "--root", str(root)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            yield {"root": root, "old": old, "odd": odd, "github": github}
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def until(what, check, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def install_of(root, node):
    installs = nodes_json(root)[node]["installs"]
    return installs[0] if installs else {}


def test_a_cpu_without_avx2_carries_a_standing_warning(fleet):
    install = until("oldcpu ready", lambda: install_of(fleet["root"], "oldcpu").get("state") == "ready"
                    and install_of(fleet["root"], "oldcpu"))
    assert "lacks AVX2" in install["detail"] and "several times slower" in install["detail"]
    assert "AVX2" not in install_of(fleet["root"], "odd").get("detail", "")


def test_hostile_names_and_paths_reach_the_node_as_data_not_commands(fleet):
    root, odd = fleet["root"], fleet["odd"]
    until("both replicas ready", lambda: sum(
        r["state"] == "ready" for n in nodes_json(root).values() for r in n["replicas"]) == 2)
    for node in (odd, fleet["old"]):
        assert node.exec(["sh", "-c", "ls /tmp/pwned* 2>/dev/null"]).stdout == ""
    assert odd.exec(["test", "-d", HOSTILE_DIR + "/engines/llamacpp"]).returncode == 0


def test_a_library_removed_after_install_is_found_and_repaired(fleet):
    root, old = fleet["root"], fleet["old"]
    until("oldcpu ready", lambda: install_of(root, "oldcpu").get("state") == "ready")
    lib = f"/opt/llmgw/engines/llamacpp/{VERSION}-cpu/llama-{VERSION}/libggml-base.so.0.26.0"
    old.exec(["rm", "-f", lib])
    until("the library back", lambda: old.exec(["test", "-f", lib]).returncode == 0, timeout=60)
    until("ready again", lambda: install_of(root, "oldcpu").get("state") == "ready")
    assert fleet["github"].counts["download"] == {ASSET: 1}  # repaired from the control plane's cache
