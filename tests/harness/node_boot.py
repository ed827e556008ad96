"""How a test node is built and torn down: its files, network, launch command and purge.

Used by nodes.py; kept apart so that module reads as the API the tests use.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import systemd_node

SAFE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8"}
SSHD_DIR = "/etc/ssh/llmgw-test"
HOST_KEY = f"{SSHD_DIR}/ssh_host_ed25519_key"
SSHD_LOG = "/var/log/llmgw-test-sshd.log"
SSHD_COMMAND = f"/usr/sbin/sshd -D -e -f {SSHD_DIR}/sshd_config"
SSHD_START = f"setsid -f /bin/sh -c 'exec {SSHD_COMMAND} </dev/null >>{SSHD_LOG} 2>&1'"
SSHD_CONFIG = f"""\
Port 22
ListenAddress 0.0.0.0
HostKey {HOST_KEY}
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
PidFile none
StrictModes no
UseDNS no
PrintMotd no
AuthorizedKeysFile .ssh/authorized_keys {SSHD_DIR}/authorized_keys
AcceptEnv LANG LC_*
Subsystem sftp /usr/lib/openssh/sftp-server
"""
# Runs as PID 1 of the node's new PID + mount namespace, before chroot into the overlay root.
SETUP = r"""
set -eu
R="$NODE_DIR/merged"
mount -t overlay overlay -o "lowerdir=/,upperdir=$NODE_DIR/upper,workdir=$NODE_DIR/work" "$R"
mount -t proc proc "$R/proc"
mount --bind "$R/proc/sys" "$R/proc/sys"
mount -o remount,bind,ro "$R/proc/sys"
if [ -f "$NODE_DIR/cpuinfo" ]; then mount --bind "$NODE_DIR/cpuinfo" "$R/proc/cpuinfo"; fi
mount -t sysfs -o ro sysfs "$R/sys"
if [ "$NODE_KIND" = systemd ]; then mount -t cgroup2 cgroup2 "$R/sys/fs/cgroup"; fi
mount -t tmpfs -o mode=755,size=16m tmpfs "$R/dev"
for d in null zero full random urandom tty; do
  touch "$R/dev/$d"; mount --bind "/dev/$d" "$R/dev/$d"
done
mkdir "$R/dev/pts" "$R/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$R/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
ln -s pts/ptmx "$R/dev/ptmx"; ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"
ln -s /proc/self/fd/2 "$R/dev/stderr"
mount -t tmpfs -o mode=755 tmpfs "$R/run"
mkdir -m 755 "$R/run/sshd"
mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
hostname "$NODE_NAME"
cd "$R"
if [ -n "$NODE_BOOT" ]; then chroot . /usr/bin/env -i "PATH=$PATH" /bin/sh -c "$NODE_BOOT"; fi
exec chroot . /usr/bin/env -i "PATH=$PATH" "$@"
"""
# PID 1 of a plain node: reap orphans so a dead daemon does not linger as a zombie
# (a zombie still answers `kill -0`).
REAPER = """
import os, signal
def reap(*_):
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
signal.signal(signal.SIGCHLD, reap)
signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
reap()
while True:
    signal.pause()
"""




class NodeHarnessError(RuntimeError):
    """A test node could not be built, reached or cleaned up."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and result.returncode != 0:
        raise NodeHarnessError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")
    return result


def mac(*parts: str) -> str:
    """Derive a fixed, locally administered MAC, so a re-created node keeps its ARP identity."""
    digest = hashlib.sha256("/".join(parts).encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except (OSError, IndexError):
        return False


def key_line(pub: str) -> str:
    return " ".join(pub.split()[:2])


def prepare_files(node_dir: Path, name: str, netns: str, keys: list[str], systemd: bool,
                  os_release: str | None, cpuinfo: str | None) -> str:
    """Fill the node's upper dir before boot; return its host public key line."""
    shutil.rmtree(node_dir, ignore_errors=True)
    upper = node_dir / "upper"
    for sub in ("upper" + SSHD_DIR, "work", "merged"):
        (node_dir / sub).mkdir(parents=True)
    home = upper / "root"  # opaque: hides the host's /root (its .bashrc runs pyenv: +340 ms)
    shutil.copytree("/etc/skel", home)
    home.chmod(0o700)
    os.setxattr(home, "trusted.overlay.opaque", b"y")
    (home / ".ssh").mkdir(mode=0o700)
    (home / ".ssh/authorized_keys").write_text("".join(k.strip() + "\n" for k in keys))
    etc = upper / "etc"
    (etc / "hostname").write_text(name + "\n")
    (etc / "machine-id").write_text(hashlib.md5(netns.encode()).hexdigest() + "\n")
    if os_release is not None:
        (etc / "os-release").write_text(os_release)  # replaces the symlink to /usr/lib/os-release
    if cpuinfo is not None:
        (node_dir / "cpuinfo").write_text(cpuinfo)
    sshd_dir = upper / SSHD_DIR.lstrip("/")
    (sshd_dir / "sshd_config").write_text(SSHD_CONFIG)
    (sshd_dir / "authorized_keys").write_text("")
    key = upper / HOST_KEY.lstrip("/")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}",
                    "-f", str(key)], check=True)
    shutil.copy(key, node_dir / "host_key.orig")
    shutil.copy(f"{key}.pub", node_dir / "host_key.orig.pub")
    if systemd:
        systemd_node.prepare_root(upper, SSHD_COMMAND)
    return key_line(Path(f"{key}.pub").read_text())


def create_network(netns: str, veth: str, address: str, bridge: str, gateway: str) -> None:
    """Make the netns with eth0 at address/24 (fixed MACs), its peer on the bridge."""
    ip("netns", "add", netns)
    ip("link", "add", veth, "address", mac("host", netns), "type", "veth",
       "peer", "name", "eth0", "address", mac("node", netns), "netns", netns)
    ip("link", "set", veth, "master", bridge, "up")
    for args in (("addr", "add", f"{address}/24", "dev", "eth0"), ("link", "set", "lo", "up"),
                 ("link", "set", "eth0", "up"), ("route", "add", "default", "via", gateway)):
        ip("-n", netns, *args)
    ip("neigh", "flush", "to", address, check=False)


def launch_command(netns: str, name: str, node_dir: Path, systemd: bool,
                   cgroup: Path | None) -> tuple[list[str], dict[str, str]]:
    """Return argv and env that start the node's namespaces, mounts and init."""
    if systemd:
        init = ["container=llmgw-test", systemd_node.SYSTEMD, "--system",
                "--unit=multi-user.target"]
    else:
        init = ["/usr/bin/python3", "-c", REAPER]
    argv = ["nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--pid", "--fork",
            "--kill-child", "--mount", "--uts", "--cgroup", "--propagation", "private", "--",
            "/bin/sh", "-c", SETUP, "setup", *init]
    if cgroup is not None:  # joined before unshare --cgroup, so it becomes the node's root
        argv = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs"),
                *argv]
    env = dict(SAFE_ENV, NODE_DIR=str(node_dir), NODE_NAME=name,
               NODE_KIND="systemd" if systemd else "plain",
               NODE_BOOT="" if systemd else SSHD_START)
    return argv, env


def purge(netns: str, veth: str | None, address: str | None, cgroup: Path | None) -> list[str]:
    """Remove a node's processes, cgroup, netns and veth, whoever left them there."""
    errors = []
    pids = ip("netns", "pids", netns, check=False).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)  # SIGKILL to a PID 1 ends its whole namespace
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while any(alive(int(p)) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    errors += systemd_node.kill_cgroup(cgroup)
    for args in (("netns", "del", netns), ("link", "del", veth or "")):
        result = ip(*args, check=False)
        if result.returncode != 0 and not re.search(r"No such|Cannot find|does not exist",
                                                    result.stderr):
            errors.append(f"ip {' '.join(args)}: {result.stderr.strip()}")
    if address:
        ip("neigh", "flush", "to", address, check=False)
    return errors


def lock_subnet(tag: str) -> int:
    """Hold a lock on the subnet while a cluster lives; a crashed holder releases it."""
    path = Path("/run/lock" if os.path.isdir("/run/lock") else "/tmp") / f"llmgw-test-{tag}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise NodeHarnessError(f"subnet {tag} is in use by a live NodeCluster (pid "
                               f"{path.read_text().strip()}); give this one another "
                               "subnet_prefix, e.g. one per pytest-xdist worker") from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def upper_fs_problem(workdir: Path) -> str | None:
    """Say why workdir cannot hold overlay upper dirs (overlayfs on overlayfs, as in Docker)."""
    path, best, fstype = str(workdir.resolve()), "", ""
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        before, _, after = line.partition(" - ")
        mount_point = before.split(" ")[4].replace("\\040", " ")
        if (path + "/").startswith(mount_point.rstrip("/") + "/") and len(mount_point) >= len(best):
            best, fstype = mount_point, after.split(" ")[0]
    if fstype == "overlay":
        return (f"{workdir} is on overlayfs, which cannot hold the nodes' overlay upper dirs; "
                "use a workdir on ext4, xfs or tmpfs")
    return None
