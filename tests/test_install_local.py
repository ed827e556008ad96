"""The real install path against this machine through the local transport (no root, no SSH)."""
import asyncio

import pytest

from llmgw.executors.release import ReleaseCache
from llmgw.executors.transport import LocalTransport
from llmgw.models import Node
from llmgw.services import nodes
from llmgw.services.install import Installer
from tests.harness.fake_github import FakeGitHub
from tests.test_release_cache import tarball

FAKE_SERVER = b"#!/bin/sh\necho 'version: 10991 (fake)'\n"
ASSET = "llama-b10991-bin-ubuntu-x64.tar.gz"


@pytest.fixture
def node(app, tmp_path):
    n = asyncio.run(nodes.add_local_node("here", str(tmp_path / "node")))
    if n.facts["arch"] != "amd64":
        pytest.skip("these archives are named for x86_64")
    return n


def install(node, gh, tmp_path):
    cache = ReleaseCache(tmp_path / "cache", gh.base_url, gh.base_url)
    return asyncio.run(Installer(Node.get_by_id(node.id), LocalTransport(), cache).converge(
        "llamacpp", "b10991"))


def executable_tarball(extra=()):
    return tarball([("build/bin/llama-server", "file", FAKE_SERVER), *extra])


def test_a_verified_install_is_renamed_into_place_with_a_marker(node, tmp_path):
    with FakeGitHub() as gh:
        gh.add_release("b10991", {ASSET: executable_tarball()})
        row = install(node, gh, tmp_path)
    assert row.state == "ready", row.detail
    assert row.detail.startswith("llama-server version: 10991 (fake)")
    final = tmp_path / "node" / "engines" / "llamacpp" / "b10991-cpu"
    assert (final / ".llmgw-installed").exists() and row.binary == str(final / "build/bin/llama-server")
    assert not (tmp_path / "node" / "engines" / "llamacpp" / "b10991-cpu.partial").exists()


def test_an_archive_escaping_its_directory_is_refused_before_it_reaches_the_node(node, tmp_path):
    evil = executable_tarball([("build/bin/x", "symlink", "../../../../../../etc/passwd")])
    with FakeGitHub() as gh:
        gh.add_release("b10991", {ASSET: evil})
        row = install(node, gh, tmp_path)
    assert row.state == "failed"
    assert "build/bin/x is a link to ../../../../../../etc/passwd, outside the install directory" in row.detail
    assert not (tmp_path / "node" / "engines" / "llamacpp" / "b10991-cpu").exists()


def test_a_broken_install_is_found_by_the_next_verification_and_repaired(node, tmp_path):
    with FakeGitHub() as gh:
        gh.add_release("b10991", {ASSET: executable_tarball()})
        first = install(node, gh, tmp_path)
        assert first.state == "ready", first.detail
        binary = tmp_path / "node/engines/llamacpp/b10991-cpu/build/bin/llama-server"
        binary.unlink()
        row = install(node, gh, tmp_path)
        assert row.state == "ready" and binary.exists()
        assert gh.counts["download"] == {ASSET: 1}  # repaired from the control plane's cache


def test_an_install_into_a_base_dir_with_a_space_finds_and_runs_its_binary(app, tmp_path):
    n = asyncio.run(nodes.add_local_node("spaced", str(tmp_path / "llmgw node")))
    if n.facts["arch"] != "amd64":
        pytest.skip("these archives are named for x86_64")
    with FakeGitHub() as gh:
        gh.add_release("b10991", {ASSET: executable_tarball()})
        row = install(n, gh, tmp_path)
    assert row.state == "ready", row.detail
    assert row.binary == str(tmp_path / "llmgw node/engines/llamacpp/b10991-cpu/build/bin/llama-server")
