"""A fleet installing at once: one release lookup and one download each asset, the build each
architecture needs, and a plain refusal where none fits."""
import json
import subprocess

import pytest

from tests.e2e.conftest import (CACHE, VERSION, cli, configure, need_test_nodes, nodes_json,
                                operator_key)
from tests.harness import nodes as harness

pytestmark = pytest.mark.e2e
X64 = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"
CUDA = f"llama-{VERSION}-bin-ubuntu-cuda-12.8-x64.tar.gz"
CUDART = f"cudart-llama-{VERSION}-bin-ubuntu-cuda-12.8-x64.tar.gz"
DRIVER = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
          "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")
FAKE_NVIDIA_SMI = ("#!/bin/sh\necho '0, GPU-1c2d3e4f-5a6b-7c8d-9e0f-a1b2c3d4e5f6, NVIDIA H100 80GB HBM3, "
                   "81559, 0, 550.54.15, 00000000:18:00.0, 29, 0'\n"
                   "echo '1, GPU-2c2d3e4f-5a6b-7c8d-9e0f-a1b2c3d4e5f7, NVIDIA H100 80GB HBM3, "
                   "81559, 0, 550.54.15, 00000000:2A:00.0, 33, 7'\n")
ARM64 = f"llama-{VERSION}-bin-ubuntu-arm64.tar.gz"
FAKE_UNAME = '#!/bin/sh\n[ "$1" = -m ] && echo {machine} && exit 0\nexec /usr/bin/uname "$@"\n'


def cudart_tarball(work):
    """A stand-in for the CUDA runtime archive published beside the CUDA build."""
    lib = work / "cudart" / f"llama-{VERSION}"
    lib.mkdir(parents=True)
    (lib / "libcudart.so.12").write_bytes(b"not really the CUDA runtime\n")
    out = work / CUDART
    subprocess.run(["tar", "-czf", str(out), "-C", str(work / "cudart"), f"llama-{VERSION}"], check=True)
    return out


def fake_nvidia(node):
    """A loaded NVIDIA driver as discovery sees one: /proc/driver/nvidia/version and nvidia-smi.

    /proc cannot be written, so the node's own mount namespace gets a tmpfs over /proc/driver.
    """
    result = node.exec(["sh", "-c", "mount -t tmpfs none /proc/driver && mkdir /proc/driver/nvidia"])
    assert result.returncode == 0, result.stderr
    node.write_file("/proc/driver/nvidia/version", DRIVER)
    node.write_file("/usr/local/bin/nvidia-smi", FAKE_NVIDIA_SMI, mode=0o755)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    work = tmp_path_factory.mktemp("fleet")
    operator, pub = operator_key(work)
    with FakeGitHub(redirect=True) as github, \
            harness.NodeCluster(work / "nodes", [pub], subnet_prefix="10.250.5") as cluster:
        tarball = llama_server_tarball(CACHE)
        # The arm64 archive holds the x64 build: what is tested is which asset each node asks for.
        github.add_release(VERSION, {X64: tarball, ARM64: tarball, CUDA: tarball,
                                     CUDART: cudart_tarball(work)})
        names = [f"n{i}" for i in range(10)] + ["arm", "rv", "gpu"]
        booted = {name: cluster.add(name, wait=False) for name in names}
        for node in booted.values():
            node.wait_ready(60)
        booted["arm"].write_file("/usr/local/bin/uname", FAKE_UNAME.format(machine="aarch64"), mode=0o755)
        booted["rv"].write_file("/usr/local/bin/uname", FAKE_UNAME.format(machine="riscv64"), mode=0o755)
        fake_nvidia(booted["gpu"])
        root = work / "cp"
        cli(root, "init")
        configure(root, github)
        for name, node in booted.items():
            cli(root, "add-node", name, "--addr", node.ip, "--bootstrap-key", str(operator))
        cli(root, "reconcile", "--once")
        yield {"root": root, "nodes": booted, "github": github}


def test_ten_nodes_cost_one_metadata_request_and_one_download(fleet):
    installs = {name: n["installs"][0] for name, n in nodes_json(fleet["root"]).items()}
    assert all(installs[f"n{i}"]["state"] == "ready" for i in range(10)), installs
    assert fleet["github"].counts["metadata"] == 1
    assert fleet["github"].counts["download"][X64] == 1


def test_an_arm64_host_installs_the_arm64_asset(fleet):
    install = nodes_json(fleet["root"])["arm"]["installs"][0]
    assert install["state"] == "ready", install
    marker = json.loads(fleet["nodes"]["arm"].read_file(
        f"/opt/llmgw/engines/llamacpp/{VERSION}-cpu/.llmgw-installed"))
    assert list(marker["sha256"]) == [ARM64]
    assert fleet["github"].counts["download"][ARM64] == 1


def test_riscv64_is_unsupported_with_the_reason(fleet):
    install = nodes_json(fleet["root"])["rv"]["installs"][0]
    assert install["state"] == "unsupported"
    assert install["detail"] == "llama.cpp publishes no Linux build for riscv64"
    assert fleet["nodes"]["rv"].exec(["ls", "/opt/llmgw/engines"]).stdout.strip() == ""


def test_a_host_with_an_nvidia_driver_gets_the_cuda_build_and_its_runtime(fleet):
    node = nodes_json(fleet["root"])["gpu"]
    install = node["installs"][0]
    assert (install["state"], install["variant"]) == ("ready", "cuda-12.8"), install
    assert fleet["github"].counts["download"][CUDA] == 1
    assert fleet["github"].counts["download"][CUDART] == 1
    gpus = {g["index"]: g for g in node["gpus"]}
    assert gpus[0]["class"] == "h100-80g" and gpus[0]["healthy"]
    assert not gpus[1]["healthy"] and "7 uncorrected ECC errors" in gpus[1]["reason"]
