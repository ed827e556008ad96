"""engines.download_on_node: the node fetches the archive itself, still checked against the digest."""
import subprocess

import pytest

from tests.e2e.conftest import CACHE, VERSION, cli, configure, nodes_json
from tests.harness import nodes as harness

pytestmark = pytest.mark.e2e
ASSET = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"


def test_a_node_downloads_and_verifies_the_archive_itself(tmp_path):
    reason = harness.require_root_reason()
    if reason:
        pytest.skip(reason)
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    operator = tmp_path / "operator_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(operator)], check=True)
    pub = (tmp_path / "operator_key.pub").read_text().strip()
    with harness.NodeCluster(tmp_path / "nodes", [pub], subnet_prefix="10.250.6") as cluster, \
            FakeGitHub(host=cluster.host_ip, redirect=True) as github:
        github.add_release(VERSION, {ASSET: llama_server_tarball(CACHE)})
        node = cluster.add("self")
        root = tmp_path / "cp"
        cli(root, "init")
        configure(root, github)
        text = (root / "server.toml").read_text().replace("[engines]", "[engines]\ndownload_on_node = true")
        (root / "server.toml").write_text(text)
        cli(root, "add-node", "self", "--addr", node.ip, "--bootstrap-key", str(operator))
        cli(root, "reconcile", "--once")
        install = nodes_json(root)["self"]["installs"][0]
        assert install["state"] == "ready", install
        assert github.counts == {"metadata": 1, "download": {ASSET: 1}}
        assert not list((root / "cache").rglob(ASSET))  # it never passed through the control plane
        assert node.exec(["test", "-f", f"/opt/llmgw/engines/llamacpp/{VERSION}-cpu/.llmgw-installed"]).returncode == 0
