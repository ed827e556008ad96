"""Onboarding on real nodes: several addresses, a sudo user, a user sudo asks a password of,
labels, and removing a node with an engine running on it."""
import subprocess
import time

import pytest

from tests.e2e.conftest import (CACHE, VERSION, cli, configure, need_test_nodes, nodes_json,
                                operator_key, wait_for)
from tests.harness import nodes as harness
from tests.harness.node_boot import HOST_KEY

pytestmark = pytest.mark.e2e
ASSET = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"
PREFIX = "10.250.3"


def add_user(node, user, sudoers_line, operator_pub):
    node.exec(["useradd", "-m", "-s", "/bin/sh", user], timeout=30)
    node.exec(["usermod", "-p", "*", user])  # no password, but not locked: sshd refuses locked accounts
    node.write_file(f"/home/{user}/.ssh/authorized_keys", operator_pub + "\n", mode=0o600)
    node.exec(["chown", "-R", f"{user}:{user}", f"/home/{user}/.ssh"])
    node.write_file(f"/etc/sudoers.d/{user}", sudoers_line + "\n", mode=0o440)
    # sudo looks up the host's own name; with no DNS reachable that costs 20 s per command.
    hostname = node.exec(["hostname"]).stdout.strip()
    hosts = node.read_file("/etc/hosts")
    node.write_file("/etc/hosts", hosts + f"\n127.0.1.1 {hostname}\n")


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    from tests.harness.tiny_gguf import write_tiny_gguf
    work = tmp_path_factory.mktemp("onboard")
    operator, pub = operator_key(work)
    with FakeGitHub() as github, harness.NodeCluster(work / "nodes", [pub], subnet_prefix=PREFIX) as nodes:
        github.add_release(VERSION, {ASSET: llama_server_tarball(CACHE)})
        ops, asker = nodes.add("ops"), nodes.add("asker")
        add_user(ops, "ops", "ops ALL=(ALL) NOPASSWD: ALL", pub)
        add_user(asker, "asker", "asker ALL=(ALL) ALL", pub)
        root = work / "cp"
        cli(root, "init")
        configure(root, github)
        cli(root, "model", "add", "tiny", "--file", str(write_tiny_gguf(work / "tiny.gguf")),
            "--replicas", "1", "--arg=-t", "--arg=1", "--arg=-c", "--arg=256")
        yield {"root": root, "ops": ops, "asker": asker, "operator": operator}


def test_a_sudo_user_on_a_second_address_gets_a_working_engine(fleet):
    root, ops = fleet["root"], fleet["ops"]
    dead = f"{PREFIX}.250:22"  # nothing answers there: the next address is tried
    out = cli(root, "add-node", "ops", "--addr", f"{dead},{ops.ip}", "--user", "ops",
              "--bootstrap-key", str(fleet["operator"]), "--label", "gpu=none", "--label", "rack=r7",
              "--fabric", "ib-a:mlx5_0", "--mgmt-iface", "eth0").stdout
    assert "(commands via sudo as ops)" in out
    cli(root, "reconcile", "--once")
    node = nodes_json(root)["ops"]
    assert node["labels"] == {"gpu": "none", "rack": "r7"} and node["addr"] == ops.ip
    assert node["installs"][0]["state"] == "ready", node["installs"]
    assert [r["state"] for r in node["replicas"]] in (["starting"], ["ready"])
    # --mgmt-iface eth0: the engine listens on that interface's address only, and is reached there.
    endpoint = node["replicas"][0]["endpoint"]
    assert endpoint.startswith(f"http://{ops.ip}:"), endpoint
    port = int(endpoint.rsplit(":", 1)[1])

    def listening():
        return [line.split()[3] for line in ops.exec(["ss", "-ltnH"]).stdout.splitlines()
                if line.split()[3].endswith(f":{port}")]
    assert wait_for("the engine to listen", listening, timeout=60, every=0.5) == [f"{ops.ip}:{port}"]
    owner = ops.exec(["stat", "-c", "%U", f"/opt/llmgw/engines/llamacpp/{VERSION}-cpu"]).stdout.strip()
    assert owner == "root"


def test_a_user_sudo_asks_a_password_of_is_refused_with_the_fix(fleet):
    result = cli(fleet["root"], "add-node", "asker", "--addr", fleet["asker"].ip, "--user", "asker",
                 "--bootstrap-key", str(fleet["operator"]), check=False)
    assert result.returncode != 0
    assert "sudo asks asker for a password" in result.stderr and "NOPASSWD" in result.stderr


def test_bad_labels_are_refused_by_name(fleet):
    result = cli(fleet["root"], "add-node", "x", "--addr", "10.250.3.1", "--label", "a b=c;d",
                 check=False)
    assert result.returncode != 0 and "--label 'a b=c;d' is not key=value" in result.stderr


def test_removing_a_node_stops_its_engines_first(fleet):
    root, ops = fleet["root"], fleet["ops"]
    deadline = time.monotonic() + 60
    while ops.exec(["pgrep", "-f", "llama-server"]).stdout == "":
        assert time.monotonic() < deadline, "no engine ever ran on ops"
        cli(root, "reconcile", "--once")
    out = cli(root, "remove-node", "ops").stdout
    assert "removed ops; stopped llmgw-tiny-0" in out
    assert ops.exec(["pgrep", "-f", "llama-server"]).stdout == ""
    assert "ops" not in nodes_json(root)


def test_a_password_typed_once_installs_the_key_and_is_not_kept(fleet):
    import os
    import sys
    from tests.conftest import TOP
    root, node = fleet["root"], fleet["asker"]
    node.exec(["sh", "-c", "sed -i 's/^PasswordAuthentication no/PasswordAuthentication yes/' "
                           "/etc/ssh/llmgw-test/sshd_config"])
    add_user(node, "pwuser", "pwuser ALL=(ALL) NOPASSWD: ALL", "")
    node.exec(["sh", "-c", "echo 'pwuser:pw-for-llmgw-test' | chpasswd"])
    node.stop_sshd()
    node.start_sshd()
    env = {k: v for k, v in os.environ.items() if k != "LLMGW_ROOT"}
    result = subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw",
                             "add-node", "typed", "--addr", node.ip, "--user", "pwuser", "--password",
                             "--root", str(root)],
                            cwd=TOP, env=env, input="pw-for-llmgw-test\n", capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "added typed" in result.stdout
    keys = node.read_file("/home/pwuser/.ssh/authorized_keys")
    assert "llmgw-control-plane" in keys
    for path in root.rglob("*"):
        if path.is_file() and path.suffix != ".log":
            assert b"pw-for-llmgw-test" not in path.read_bytes(), path


def test_the_operator_s_agent_installs_the_key_and_a_wrong_fingerprint_stops_it(fleet, tmp_path):
    import os
    import sys
    from tests.conftest import TOP
    root, node = fleet["root"], fleet["ops"]
    wrong = cli(root, "add-node", "viaagent", "--addr", node.ip, "--host-key", "SHA256:" + "A" * 43,
                check=False)
    assert wrong.returncode != 0 and "not the SHA256:AAAA" in wrong.stderr
    no_agent = cli(root, "add-node", "viaagent", "--addr", node.ip, "--use-agent", check=False)
    assert no_agent.returncode != 0 and "SSH_AUTH_SOCK is not set" in no_agent.stderr
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        env = {k: v for k, v in os.environ.items() if k != "LLMGW_ROOT"}
        env["SSH_AUTH_SOCK"] = str(sock)
        subprocess.run(["ssh-add", str(fleet["operator"])], env=env, check=True, capture_output=True)
        right = node.exec(["ssh-keygen", "-lf", HOST_KEY + ".pub"]).stdout.split()[1]
        done = subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw",
                               "add-node", "viaagent", "--addr", node.ip, "--use-agent",
                               "--host-key", right, "--root", str(root)],
                              cwd=TOP, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        assert f"host key   {right} (pinned)" in done.stdout
    finally:
        agent.terminate()
        agent.wait(timeout=10)
