"""Real OpenSSH test nodes: own network namespace, IP, overlay root and sshd per node.

A node is what the cluster manager meets in production: an address with a real sshd on port
22 that takes root logins by key, and its own /etc, /opt, /var/lib and /root. It is either a
plain process tree (like a GPU-cloud container: PID 1 is a tiny reaper, so `setsid -f` daemons
outlive their SSH session) or runs the host's real systemd as PID 1.

    if reason := require_root_reason():
        pytest.skip(reason)
    with NodeCluster(tmp_path, [operator_public_key]) as cluster:
        node = cluster.add("gpu-1", systemd=True)    # sshd ready at node.ip:22 on return
        known_hosts = asyncssh.import_known_hosts(node.known_hosts_line + "\n")

Nodes are at <prefix>.10, .11, ... in add() order; the host is <prefix>.1 on bridge
llmgwbr<o2>-<o3>, so a server the test runs on the host is reachable from the nodes there.
One live NodeCluster per subnet (a lock file says so); starting one first removes what a
crashed earlier run on that subnet left behind.

Layout on the host, per node, under <workdir>/<name>/:
  upper/    the overlay's upper dir: every file the node wrote (upper/opt/llmgw/...)
  work/     overlayfs work dir;  merged/  the node's root (mounted only inside the node)
  console.log   output of the node's init (systemd) and of the mount setup
Inside the node: /etc/ssh/llmgw-test/ holds sshd_config, the host key and an extra
authorized_keys file; /var/log/llmgw-test-sshd.log is sshd's log on plain nodes.
Nothing is mounted in the host's mount namespace. How a node is built: node_boot.py;
the systemd side: systemd_node.py.
"""
from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from . import node_boot, systemd_node
from .node_boot import HOST_KEY, SAFE_ENV, SSHD_DIR, SSHD_LOG, SSHD_START, NodeHarnessError

__all__ = ["NodeCluster", "NodeHarnessError", "TestNode", "require_root_reason"]


def require_root_reason() -> str | None:
    """Say why real test nodes cannot run on this machine, or None when they can."""
    if os.geteuid() != 0:
        return "test nodes need root (network namespaces, mounts, cgroups)"
    for tool in ("/usr/sbin/sshd", "ssh-keygen", "ip", "unshare", "nsenter", "setsid", "chroot"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (apt-get install -y openssh-server iproute2 util-linux)"
    if "\toverlay\n" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    probe = subprocess.run(["unshare", "--net", "--mount", "--pid", "--uts", "--fork", "true"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot create namespaces here: {probe.stderr.strip()}"
    return None


class TestNode:
    """One node: netns `llmgw-<tag>-<name>`, veth with a fixed MAC, sshd on <ip>:22."""

    __test__ = False  # not a pytest test class
    port = 22

    def __init__(self, cluster: NodeCluster, name: str, ip: str, systemd: bool):
        self.cluster, self.name, self.ip, self.systemd = cluster, name, ip, systemd
        self.netns = f"llmgw-{cluster.tag}-{name}"
        self.veth = "lg" + hashlib.sha1(self.netns.encode()).hexdigest()[:11]
        self.dir = cluster.workdir / name
        self.upper = self.dir / "upper"
        self.cgroup: Path | None = None
        self.init_pid = 0
        self.proc: subprocess.Popen | None = None
        self.host_key_pub = ""
        self.boot_state = ""  # systemd nodes: `systemctl is-system-running` after boot

    def __repr__(self) -> str:
        return f"<TestNode {self.name} {self.ip} {'systemd' if self.systemd else 'plain'}>"

    @property
    def known_hosts_line(self) -> str:
        return f"{self.ip} {self.host_key_pub}"

    def upper_path(self, path: str) -> Path:
        """Return where a file the node wrote at `path` lies on the host."""
        return self.upper / path.lstrip("/")

    # --- running things inside -------------------------------------------------------------
    def _enter(self, argv: list[str]) -> list[str]:
        return ["nsenter", "-t", str(self.init_pid), "-a", "-r", "-w", "--", *argv]

    def exec(self, argv: list[str], timeout: float = 30, input: str | None = None
             ) -> subprocess.CompletedProcess:
        """Run argv inside the node (its namespaces and root) and capture text output."""
        return subprocess.run(self._enter(argv), capture_output=True, text=True, errors="replace",
                              input=input, timeout=timeout, env=SAFE_ENV)

    def read_bytes(self, path: str) -> bytes:
        result = subprocess.run(self._enter(["cat", "--", path]), capture_output=True,
                                timeout=30, env=SAFE_ENV)
        if result.returncode != 0:
            raise FileNotFoundError(f"{self.name}:{path}: {result.stderr.decode().strip()}")
        return result.stdout

    def read_file(self, path: str) -> str:
        """Read a file as the node sees it."""
        return self.read_bytes(path).decode()

    def write_file(self, path: str, data: str | bytes, mode: int | None = None) -> None:
        """Write a file as the node sees it (through its overlay: upper/ is not to be edited
        while the node runs, overlayfs may not see such changes)."""
        script = 'mkdir -p "$(dirname "$1")" && cat > "$1"'
        if mode is not None:
            script += f' && chmod {mode:o} "$1"'
        data = data.encode() if isinstance(data, str) else data
        result = subprocess.run(self._enter(["sh", "-c", script, "sh", path]), input=data,
                                capture_output=True, timeout=60, env=SAFE_ENV)
        if result.returncode != 0:
            raise NodeHarnessError(f"{self.name}: writing {path} failed: "
                                   f"{result.stderr.decode(errors='replace').strip()}")

    def authorize_key(self, key: str) -> None:
        """Accept one more key via the harness's own authorized_keys (not root's)."""
        self._check(["sh", "-c", f'echo "$1" >> {SSHD_DIR}/authorized_keys', "sh", key])

    def _check(self, argv: list[str]) -> str:
        result = self.exec(argv)
        if result.returncode != 0:
            raise NodeHarnessError(f"{self.name}: {argv} exited {result.returncode}: "
                                   f"{result.stderr.strip()}")
        return result.stdout

    # --- sshd ------------------------------------------------------------------------------
    def stop_sshd(self) -> None:
        """Make the node unreachable over SSH: listener and open sessions go, the rest stays."""
        if self.systemd:
            self._check(["systemctl", "stop", systemd_node.SSHD_UNIT])
        self.exec(["pkill", "-x", "sshd"])
        deadline = time.monotonic() + 10
        while self.exec(["pgrep", "-x", "sshd"]).returncode == 0:
            if time.monotonic() > deadline:
                raise NodeHarnessError(f"{self.name}: sshd still running 10 s after stop")
            time.sleep(0.05)

    def start_sshd(self, timeout: float = 30) -> None:
        if self.systemd:
            self.exec(["systemctl", "reset-failed", systemd_node.SSHD_UNIT])
            self._check(["systemctl", "start", systemd_node.SSHD_UNIT])
        else:
            subprocess.run(self._enter(["sh", "-c", SSHD_START]), env=SAFE_ENV, timeout=30,
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, check=True)
        self.wait_ready(timeout)

    def set_host_key(self, new: bool = True) -> str:
        """Give the node a fresh host key (new=False: its original one) and restart sshd."""
        if new:
            self._check(["sh", "-c", f'rm -f {HOST_KEY} {HOST_KEY}.pub && ssh-keygen -q '
                         f'-t ed25519 -N "" -C root@{self.name} -f {HOST_KEY}'])
        else:
            self.write_file(HOST_KEY, (self.dir / "host_key.orig").read_text(), mode=0o600)
            self.write_file(f"{HOST_KEY}.pub", (self.dir / "host_key.orig.pub").read_text())
        self.host_key_pub = node_boot.key_line(self.read_file(f"{HOST_KEY}.pub"))
        self.stop_sshd()
        self.start_sshd()
        return self.host_key_pub

    def set_network(self, up: bool) -> None:
        """Unplug the node's cable (up=False: packets vanish, connects time out) or replug it."""
        node_boot.ip("link", "set", self.veth, "up" if up else "down")

    def ssh_ready(self) -> bool:
        try:
            with socket.create_connection((self.ip, self.port), timeout=1) as sock:
                return sock.recv(64).startswith(b"SSH-")
        except OSError:
            return False

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait until sshd answers with its banner on <ip>:22."""
        start = time.monotonic()
        next_look = start + 1
        while not self.ssh_ready():
            if self.proc is None or self.proc.poll() is not None:
                code = self.proc and self.proc.returncode
                raise NodeHarnessError(f"{self.name}: the node's init exited ({code})\n"
                                       f"{self.diagnostics()}")
            if time.monotonic() > next_look:  # fail fast when sshd is already dead
                next_look += 1
                if self._sshd_dead():
                    raise NodeHarnessError(f"{self.name}: sshd died\n{self.diagnostics()}")
            if time.monotonic() > start + timeout:
                raise NodeHarnessError(f"{self.name}: no SSH banner from {self.ip}:22 after "
                                       f"{timeout:.0f} s\n{self.diagnostics()}")
            time.sleep(0.03)
        if self.systemd:  # a booted node, like the real ones: no start jobs still running
            state = self.exec(["systemctl", "is-system-running", "--wait"], timeout=timeout)
            self.boot_state = state.stdout.strip()

    def _sshd_dead(self) -> bool:
        if self.systemd:
            result = self.exec(["systemctl", "is-failed", systemd_node.SSHD_UNIT], timeout=10)
            return result.stdout.strip() == "failed"
        return self.exec(["pgrep", "-x", "sshd"], timeout=10).returncode == 1

    def diagnostics(self) -> str:
        """Collect what the node's init and sshd said, for error messages."""
        parts = []
        try:
            console = (self.dir / "console.log").read_text(errors="replace")
            parts.append("console:\n" + console[-4000:])
        except OSError:
            pass
        try:
            if self.systemd:
                out = self.exec(["journalctl", "-n", "40", "--no-pager"], timeout=10)
                parts.append("journal:\n" + out.stdout + out.stderr)
            else:
                parts.append("sshd:\n" + self.upper_path(SSHD_LOG).read_text(errors="replace"))
        except (OSError, subprocess.SubprocessError):
            pass
        return "\n".join(parts)

    # --- lifecycle -------------------------------------------------------------------------
    def _boot(self, keys: list[str], os_release: str | None, cpuinfo: str | None) -> None:
        c = self.cluster
        self.host_key_pub = node_boot.prepare_files(self.dir, self.name, self.netns, keys,
                                                    self.systemd, os_release, cpuinfo)
        node_boot.create_network(self.netns, self.veth, self.ip, c.bridge, c.host_ip)
        self.cgroup = systemd_node.make_cgroup(self.netns)
        if self.cgroup is None and self.systemd:
            raise NodeHarnessError(systemd_node.systemd_reason() or "no cgroup for systemd")
        argv, env = node_boot.launch_command(self.netns, self.name, self.dir, self.systemd,
                                             self.cgroup)
        with open(self.dir / "console.log", "ab") as console:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 10
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while not self.init_pid:
            try:
                self.init_pid = int(children.read_text().split()[0])
            except (OSError, IndexError):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise NodeHarnessError(f"{self.name}: the node's namespaces did not start\n"
                                           f"{self.diagnostics()}") from None
                time.sleep(0.005)

    def _halt(self) -> None:
        """Ask systemd to power off (SIGTERM to `unshare --fork` is ignored); kill a plain node."""
        if self.init_pid and self.proc and self.proc.poll() is None:
            os.kill(self.init_pid, systemd_node.HALT_SIGNAL if self.systemd else signal.SIGKILL)

    def _finish(self, deadline: float) -> list[str]:
        """Kill what is left of the node and remove its cgroup, netns and veth."""
        errors = []
        if self.proc is not None:
            try:
                self.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for pid in (self.init_pid, self.proc.pid):  # SIGKILL to PID 1 ends the namespace
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    errors.append(f"{self.name}: pid {self.proc.pid} survived SIGKILL")
        return errors + node_boot.purge(self.netns, self.veth, self.ip, self.cgroup)


class NodeCluster:
    """A bridge at <prefix>.1/24 and test nodes at <prefix>.10, .11, ...; a context manager."""

    def __init__(self, workdir: Path, authorized_keys: list[str], subnet_prefix: str = "10.250.0"):
        reason = require_root_reason()
        if reason:
            raise NodeHarnessError(reason)
        octets = subnet_prefix.split(".")
        if len(octets) != 3 or not all(o.isdigit() and int(o) < 256 for o in octets):
            raise ValueError(f"subnet_prefix must be three octets like 10.250.0, "
                             f"not {subnet_prefix!r}")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        if problem := node_boot.upper_fs_problem(self.workdir):
            raise NodeHarnessError(problem)
        self.authorized_keys = list(authorized_keys)
        self.prefix = subnet_prefix
        self.host_ip = f"{subnet_prefix}.1"  # what nodes reach the host at
        self.tag = f"{octets[1]}-{octets[2]}"
        self.bridge = f"llmgwbr{self.tag}"
        self.nodes: dict[str, TestNode] = {}
        self._closed = False
        self._lock = node_boot.lock_subnet(self.tag)  # so what is left now is from a dead run
        try:
            self._purge_leftovers()
            node_boot.ip("link", "add", self.bridge, "address",
                         node_boot.mac("bridge", self.bridge), "type", "bridge")
            node_boot.ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
            node_boot.ip("link", "set", self.bridge, "up")
        except BaseException:
            os.close(self._lock)
            raise
        atexit.register(self.close)

    def __enter__(self) -> NodeCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _purge_leftovers(self) -> None:
        """Clean what a crashed earlier run with the same subnet left behind."""
        prefix = f"llmgw-{self.tag}-"
        listing = node_boot.ip("netns", "list").stdout.splitlines()
        names = [line.split()[0] for line in listing if line]
        cg_root = systemd_node.cgroup2_root()
        cgroups = list(cg_root.glob(prefix + "*")) if cg_root else []
        names += [cg.name for cg in cgroups]
        for netns in sorted(set(n for n in names if n.startswith(prefix))):
            node_boot.purge(netns, None, None, cg_root / netns if cg_root else None)
        node_boot.ip("link", "del", self.bridge, check=False)

    def add(self, name: str, *, systemd: bool = False, os_release: str | None = None,
            cpuinfo: str | None = None, wait: bool = True, timeout: float = 60) -> TestNode:
        """Boot one node; with wait=False, call node.wait_ready() later (boots in parallel)."""
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,30}", name) or name in self.nodes:
            raise ValueError(f"node name {name!r} is taken or not [a-z0-9-]")
        if self._closed:
            raise NodeHarnessError("this NodeCluster is closed")
        if systemd and (reason := systemd_node.systemd_reason()):
            raise NodeHarnessError(reason)
        node = TestNode(self, name, f"{self.prefix}.{10 + len(self.nodes)}", systemd)
        self.nodes[name] = node
        try:
            cg_root = systemd_node.cgroup2_root()
            node_boot.purge(node.netns, node.veth, node.ip, cg_root and cg_root / node.netns)
            node._boot(self.authorized_keys, os_release, cpuinfo)
            if wait:
                node.wait_ready(timeout)
        except BaseException:
            node._halt()
            node._finish(time.monotonic() + 3)
            del self.nodes[name]
            raise
        return node

    def close(self) -> None:
        """Stop every node and remove netns, veths, bridge and cgroups; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        errors = []
        for node in self.nodes.values():  # all halt in parallel: ~0.2 s each when booted
            try:
                node._halt()
            except OSError as exc:
                errors.append(f"{node.name}: {exc}")
        deadline = time.monotonic() + 8
        for node in self.nodes.values():
            try:
                errors += node._finish(deadline)
            except Exception as exc:  # keep cleaning the other nodes
                errors.append(f"{node.name}: {exc!r}")
        result = node_boot.ip("link", "del", self.bridge, check=False)
        if result.returncode != 0 and "Cannot find" not in result.stderr:
            errors.append(f"bridge {self.bridge}: {result.stderr.strip()}")
        atexit.unregister(self.close)
        os.close(self._lock)
        if errors:
            raise NodeHarnessError("test nodes not fully cleaned up:\n" + "\n".join(errors))
