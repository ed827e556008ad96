"""The systemd and cgroup half of the test-node harness (see nodes.py).

A systemd node boots the host's own /lib/systemd/systemd as PID 1 of a fresh PID namespace,
inside a cgroup of its own, with an overlay root whose upper /etc masks everything that would
touch the real machine (sysctl, modules, binfmt, udev), needs a console (getty) or only costs
boot time (timers, timesyncd, databases, the host's own enabled services).
"""
from __future__ import annotations

import glob
import os
import signal
import time
from pathlib import Path

SYSTEMD = "/lib/systemd/systemd"
SSHD_UNIT = "llmgw-test-sshd.service"
HALT_SIGNAL = signal.SIGRTMIN + 4  # systemd: "halt" — SIGTERM means "re-exec" to PID 1

# getty fails with "Inappropriate ioctl for device"; the rest would change the real kernel's
# settings, wait for hardware, or only slow the boot down.
ALWAYS_MASKED = """
getty.target console-getty.service container-getty@.service getty@.service
serial-getty@.service getty-static.service systemd-timesyncd.service
ssh.service ssh@.service ssh.socket sshd.service
networking.service systemd-networkd.service systemd-networkd.socket
systemd-networkd-wait-online.service systemd-resolved.service NetworkManager.service
systemd-sysctl.service systemd-modules-load.service systemd-binfmt.service
proc-sys-fs-binfmt_misc.automount systemd-pstore.service systemd-udevd.service
systemd-udev-trigger.service systemd-udevd-control.socket systemd-udevd-kernel.socket
dev-hugepages.mount sys-kernel-debug.mount sys-kernel-tracing.mount sys-kernel-config.mount
sys-fs-fuse-connections.mount kmod-static-nodes.service systemd-firstboot.service
systemd-repart.service e2scrub_reap.service avahi-daemon.service avahi-daemon.socket
postgresql.service postgresql@.service mariadb.service mysql.service redis-server.service
cron.service
""".split()

SSHD_UNIT_TEXT = """\
[Unit]
Description=OpenSSH server of the llmgw test node
After=network.target

[Service]
ExecStart={sshd_command}
RuntimeDirectory=sshd
RuntimeDirectoryMode=0755
RuntimeDirectoryPreserve=yes
# Like Debian's ssh.service: stopping sshd leaves what sessions started running.
KillMode=process

[Install]
WantedBy=multi-user.target
"""


def masked_units() -> set[str]:
    """Return the units a node must not start: fixed list, timers, host-enabled services."""
    units = set(ALWAYS_MASKED)
    for pattern in ("/lib/systemd/system/*.timer", "/etc/systemd/system/*.timer",
                    "/etc/systemd/system/*.wants/*"):
        units.update(os.path.basename(p) for p in glob.glob(pattern))
    return {u for u in units if not u.endswith(".target") or u == "getty.target"}


def prepare_root(upper: Path, sshd_command: str) -> None:
    """Write the masks and the enabled sshd unit into the node's upper /etc."""
    system = upper / "etc/systemd/system"
    wants = system / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in masked_units():
        (system / unit).symlink_to("/dev/null")
    (system / SSHD_UNIT).write_text(SSHD_UNIT_TEXT.format(sshd_command=sshd_command))
    (wants / SSHD_UNIT).symlink_to(f"../{SSHD_UNIT}")
    journald = upper / "etc/systemd/journald.conf.d"  # in /run: no 8 MB journal file per node
    journald.mkdir(parents=True)
    (journald / "llmgw-test.conf").write_text("[Journal]\nStorage=volatile\nRuntimeMaxUse=32M\n")


def cgroup2_root() -> Path | None:
    """Return where the cgroup2 hierarchy is mounted (/sys/fs/cgroup/unified on hybrid hosts)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, _, after = line.partition(" - ")
        if after.split(" ", 1)[0] == "cgroup2":
            return Path(before.split(" ")[4])
    return None


def make_cgroup(name: str) -> Path | None:
    """Create a cgroup for a node; None when this machine gives us no writable cgroup2."""
    root = cgroup2_root()
    if root is None:
        return None
    path = root / name
    try:
        path.mkdir(exist_ok=True)
    except OSError:
        return None
    return path


def systemd_reason() -> str | None:
    """Say why systemd nodes cannot run here, or None when they can."""
    if not os.access(SYSTEMD, os.X_OK):
        return f"{SYSTEMD} is missing (apt-get install -y systemd)"
    root = cgroup2_root()
    if root is None:
        return "no cgroup2 hierarchy is mounted (systemd as PID 1 of a node needs one)"
    probe = root / f"llmgw-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot create a cgroup under {root} ({exc}); systemd nodes need a writable cgroup2"
    return None


def populated(path: Path) -> bool:
    try:
        return "populated 1" in (path / "cgroup.events").read_text()
    except OSError:
        return False


def kill_cgroup(path: Path | None, timeout: float = 5.0) -> list[str]:
    """Kill every process under a cgroup, then remove its directories bottom-up."""
    if path is None or not path.exists():
        return []
    try:
        (path / "cgroup.kill").write_text("1")
    except OSError:  # kernels before 5.14: kill what cgroup.procs lists
        for procs in path.rglob("cgroup.procs"):
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + timeout
    while populated(path) and time.monotonic() < deadline:
        time.sleep(0.02)
    errors = []
    for dirpath, _dirs, _files in os.walk(path, topdown=False):
        try:
            os.rmdir(dirpath)
        except OSError as exc:
            errors.append(f"cgroup {dirpath} not removed: {exc}")
    return errors
