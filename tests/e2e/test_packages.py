"""OS packages on real nodes, through each packaging family's own tool.

The package managers are faked at the boundary: scripts on the node's PATH that record
their exact argv, answer like the real tools, and (for apt) hold the lock three times.
"""
import subprocess
import sys
import time

import pytest

from tests.e2e.conftest import (CACHE, VERSION, cli, configure, need_test_nodes, nodes_json,
                                operator_key, tune)
from tests.harness import nodes as harness

pytestmark = pytest.mark.e2e
ASSET = f"llama-{VERSION}-bin-ubuntu-x64.tar.gz"
LOG = "/var/log/fake-package-manager.log"
STATE = "/var/lib/fake-package-manager"

FAKE_DPKG_QUERY = f"""#!/bin/sh
# dpkg-query -W -f='${{db:Status-Abbrev}}' PACKAGE: "ii " only once the fake apt-get installed it.
pkg=$(eval echo \\${{$#}})
if [ -e {STATE}/$pkg ]; then printf 'ii '; exit 0; fi
case "$pkg" in libgomp1) echo "dpkg-query: no packages found matching $pkg" >&2; exit 1;; esac
exec /usr/bin/dpkg-query "$@"
"""
FAKE_APT_GET = f"""#!/bin/sh
echo "apt-get $*" >> {LOG}
mkdir -p {STATE}
case " $* " in
  *" update "*)
    n=$(cat {STATE}/locks 2>/dev/null || echo 0)
    if [ "$n" -lt 3 ]; then
      echo $((n + 1)) > {STATE}/locks
      echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2
      echo "E: Unable to lock directory /var/lib/apt/lists/" >&2
      exit 100
    fi;;
  *" install "*) for p in "$@"; do case "$p" in -*|install) ;; *) touch {STATE}/$p;; esac; done;;
esac
exit 0
"""
FAKE_RPM = f"""#!/bin/sh
echo "rpm $*" >> {LOG}
[ "$1" = "-q" ] && [ -e {STATE}/$2 ] && {{ echo "$2-11.4.1-3.el9.x86_64"; exit 0; }}
echo "package $2 is not installed"; exit 1
"""
FAKE_DNF = f"""#!/bin/sh
echo "dnf $*" >> {LOG}
mkdir -p {STATE}; for p in "$@"; do case "$p" in -*|install) ;; *) touch {STATE}/$p;; esac; done
"""
ROCKY = """NAME="Rocky Linux"
VERSION="9.4 (Blue Onyx)"
ID="rocky"
ID_LIKE="rhel centos fedora"
VERSION_ID="9.4"
PRETTY_NAME="Rocky Linux 9.4 (Blue Onyx)"
"""


def fake_tools(node, tools):
    for name, text in tools.items():
        node.write_file(f"/usr/local/bin/{name}", text, mode=0o755)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    need_test_nodes()
    from tests.harness.fake_github import FakeGitHub
    from tests.harness.llama_build import llama_server_tarball
    work = tmp_path_factory.mktemp("pkg")
    operator, pub = operator_key(work)
    with FakeGitHub() as github, harness.NodeCluster(
            work / "nodes", [pub],
            subnet_prefix="10.250.1") as nodes:
        github.add_release(VERSION, {ASSET: llama_server_tarball(CACHE)})
        deb = nodes.add("deb")
        rocky = nodes.add("rocky", os_release=ROCKY)
        fake_tools(deb, {"apt-get": FAKE_APT_GET, "dpkg-query": FAKE_DPKG_QUERY})
        fake_tools(rocky, {"rpm": FAKE_RPM, "dnf": FAKE_DNF})
        root = work / "cp"
        cli(root, "init")
        configure(root, github)
        tune(root, "reconciler", package_lock_retry=1)
        for n in (deb, rocky):
            cli(root, "add-node", n.name, "--addr", n.ip, "--bootstrap-key", str(operator))
        yield {"root": root, "deb": deb, "rocky": rocky, "github": github}


def test_packages_come_from_each_family_and_a_held_lock_is_waited_out(fleet):
    root = fleet["root"]
    seen = set()
    proc = subprocess.Popen(cli_argv(root, "reconcile"), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            states = {name: n["installs"][0] if n["installs"] else {}
                      for name, n in nodes_json(root).items()}
            seen.update(s.get("detail", "") for s in states.values())
            if all(s.get("state") in ("ready", "failed") for s in states.values()):
                break
            time.sleep(0.3)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert {name: s["state"] for name, s in states.items()} == {"deb": "ready", "rocky": "ready"}, states
    assert any("waiting for another apt-get to finish" in d for d in seen), seen
    deb_log = fleet["deb"].read_file(LOG).splitlines()
    assert deb_log.count("apt-get -o=DPkg::Lock::Timeout=600 update") == 4  # three held, then through
    assert deb_log[-1] == "apt-get -o=DPkg::Lock::Timeout=600 install -y --no-install-recommends libgomp1"
    rocky_log = fleet["rocky"].read_file(LOG).splitlines()
    assert "dnf install -y libgomp" in rocky_log
    assert not any(line.startswith("apt-get") for line in rocky_log)


def cli_argv(root, *args):
    return [sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", *args,
            "--root", str(root)]
