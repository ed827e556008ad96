"""engines.download_on_node: the node fetches the archive itself, still checked against the digest."""

import pytest

from tests.e2e.conftest import (CACHE, VERSION, cli, configure, need_test_nodes, nodes_json,
                                operator_key, tune)
from tests.harness import nodes as harness

pytestmark = pytest.mark.e2e
ASSET = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"


def test_a_node_downloads_and_verifies_the_archive_itself(tmp_path):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    operator, pub = operator_key(tmp_path)
    with harness.NodeCluster(tmp_path / "nodes", [pub], subnet_prefix="10.250.6") as cluster, \
            FakeGitHub(host=cluster.host_ip, redirect=True) as github:
        github.add_release(VERSION, {ASSET: llama_server_tarball(CACHE)})
        node = cluster.add("self")
        root = tmp_path / "cp"
        cli(root, "init")
        configure(root, github)
        tune(root, "engines", download_on_node=True)
        cli(root, "add-node", "self", "--addr", node.ip, "--bootstrap-key", str(operator))
        cli(root, "reconcile", "--once")
        install = nodes_json(root)["self"]["installs"][0]
        assert install["state"] == "ready", install
        assert github.counts == {"metadata": 1, "download": {ASSET: 1}}
        assert not list((root / "cache").rglob(ASSET))  # it never passed through the control plane
        assert node.exec(["test", "-f", f"/opt/llmgw/engines/llamacpp/{VERSION}-cpu/.llmgw-installed"]).returncode == 0
