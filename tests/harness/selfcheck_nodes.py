"""Prove the test-node harness end to end: python3 tests/harness/selfcheck_nodes.py

Boots one systemd node and one plain node over real SSH (asyncssh), checks isolation, systemd
units and their journal, `setsid -f` daemons, sshd stop/start, host-key changes, recovery from
a crashed earlier run, and that close() leaves nothing behind. Prints timings; exits non-zero
on the first failed check.
"""
from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncssh  # noqa: E402

from harness.nodes import NodeCluster, require_root_reason  # noqa: E402
from harness.systemd_node import cgroup2_root  # noqa: E402

PREFIX = "10.250.7"
FAKE_OS = 'ID=rocky\nID_LIKE="rhel centos fedora"\nVERSION_ID="9.3"\nPRETTY_NAME="Rocky 9.3"\n'
FAKE_CPU = "processor\t: 0\nmodel name\t: Fake CPU without AVX2\nflags\t\t: fpu sse sse2\n\n"
TIMINGS: dict[str, float] = {}


def check(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"FAILED: {what}")
    print(f"  ok  {what}")


class timed:
    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.start = time.monotonic()

    def __exit__(self, *exc):
        TIMINGS[self.name] = time.monotonic() - self.start


def machine_state() -> dict[str, set[str]]:
    """What a test run could leave behind on the machine."""
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    cg_root = cgroup2_root()
    return {
        "netns": set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True).stdout.split()),
        "links": {line.split(": ")[1].split("@")[0] for line in links.splitlines()},
        # /run/netns is iproute2's own: made on the first `ip netns add` and kept for good.
        "mounts": {line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()
                   if line.split()[4] != "/run/netns"},
        "cgroups": {p.name for p in cg_root.iterdir() if p.is_dir()} if cg_root else set(),
        "processes": {p for p in stray_processes()},
    }


def stray_processes() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "llmgw-test" in cmd or cmd.startswith(("sleep 300", "sleep 1000")):
            found.append(f"{proc.name} {cmd}")
    return found


async def connect(node, key, **kw) -> asyncssh.SSHClientConnection:
    known = asyncssh.import_known_hosts(node.known_hosts_line + "\n")
    kw.setdefault("connect_timeout", 10)
    return await asyncssh.connect(node.ip, node.port, username="root", client_keys=[key],
                                  known_hosts=known, **kw)


async def run(conn, command: str) -> str:
    result = await conn.run(command, check=True)
    return result.stdout


@contextlib.contextmanager
def serve_http(host: str):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.HTTPServer((host, 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/"
    finally:
        server.shutdown()
        server.server_close()


def crash_a_run(workdir: Path) -> None:
    """Leave nodes behind like a test process killed mid-run would."""
    code = (f"import os, sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})\n"
            "from harness.nodes import NodeCluster\n"
            f"c = NodeCluster({str(workdir)!r}, [], subnet_prefix={PREFIX!r})\n"
            "c.add('sd', systemd=True); c.add('plain')\n"
            "os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    check("llmgw-250-7-sd" in left and "llmgw-250-7-plain" in left,
          "a crashed run left its nodes behind (to be cleaned by the next run)")


async def main() -> None:
    if reason := require_root_reason():
        raise SystemExit(f"cannot run: {reason}")
    before = machine_state()
    workdir = Path(tempfile.mkdtemp(prefix="llmgw-nodes-"))
    with timed("crashed run (subprocess, 2 nodes)"):
        crash_a_run(workdir / "crashed")
    key = asyncssh.generate_private_key("ssh-ed25519")
    pub = key.export_public_key().decode()

    with timed("cluster (incl. crashed-run cleanup)"):
        cluster = NodeCluster(workdir / "run", [pub], subnet_prefix=PREFIX)
    with cluster:
        with timed("boot systemd node"):
            sd = cluster.add("sd", systemd=True, os_release=FAKE_OS)
        with timed("boot plain node"):
            plain = cluster.add("plain", os_release=FAKE_OS, cpuinfo=FAKE_CPU)
        print(f"nodes: {sd} {plain}; systemd boot state {sd.boot_state!r}")
        with timed("first connect (both)"):
            conns = await asyncio.gather(connect(sd, key), connect(plain, key))
        c_sd, c_plain = conns
        for name, conn in (("sd", c_sd), ("plain", c_plain)):
            check("ID=rocky" in await run(conn, "cat /etc/os-release"), f"{name}: fake os-release")
            check((await run(conn, "hostname")).strip() == name, f"{name}: own hostname")
            check((await run(conn, "echo $HOME; id -u")).split() == ["/root", "0"], f"{name}: root")
            check("pyenv" not in await run(conn, "cat ~/.bashrc"), f"{name}: fresh /root")
            check("tar" in await run(conn, "python3 -c 'import sys; print(sys.version)' && "
                                     "tar --version && sha256sum /bin/ls && ldd /bin/ls && "
                                     "command -v setsid"), f"{name}: host binaries run")
        check("without AVX2" in await run(c_plain, "cat /proc/cpuinfo"), "plain: fake cpuinfo")
        check("Fake CPU" not in await run(c_sd, "cat /proc/cpuinfo"), "sd: the host's cpuinfo")
        check((await run(c_sd, "cat /proc/1/comm")).strip() == "systemd", "sd: systemd is PID 1")
        check(await run(c_plain, "test -d /run/systemd/system || echo none") == "none\n",
              "plain: no systemd")

        with serve_http(cluster.host_ip) as url:
            fetch = ("python3 -c 'import urllib.request; "
                     f"print(urllib.request.urlopen(\"{url}\").status)'")
            check(await run(c_plain, fetch) == "200\n", "node reaches a server on the bridge IP")
        banner = ("python3 -c 'import socket; "
                  f"print(socket.create_connection((\"{sd.ip}\", 22)).recv(7))'")
        check("SSH-2.0" in await run(c_plain, banner), "node reaches another node")

        await run(c_sd, "mkdir -p /opt/llmgw && echo x > /opt/llmgw/x")
        check(await run(c_plain, "test -e /opt/llmgw/x || echo absent") == "absent\n",
              "overlay: /opt/llmgw/x of sd is absent on plain")
        check(sd.upper_path("/opt/llmgw/x").read_text() == "x\n", "overlay: upper dir on host")
        check(sd.read_file("/opt/llmgw/x") == "x\n", "read_file sees the node's view")
        check(not Path("/opt/llmgw/x").exists(), "host /opt untouched")
        plain.write_file("/opt/llmgw/blob", bytes(range(256)), mode=0o600)
        check(plain.read_bytes("/opt/llmgw/blob") == bytes(range(256)), "write_file/read_bytes")

        await run(c_sd, "systemd-run --unit=llmgw-x --property=Restart=on-failure sleep 1000")
        await run(c_sd, "systemd-run --unit=llmgw-echo sh -c 'echo hello-journal; sleep 1000'")
        check((await run(c_sd, "systemctl is-active llmgw-x")).strip() == "active", "unit active")
        units = await run(c_sd, "systemctl list-units 'llmgw-*' --plain --no-legend")
        check("llmgw-x.service" in units and "llmgw-echo.service" in units, "list-units llmgw-*")
        await asyncio.sleep(0.3)
        lines = (await run(c_sd, "journalctl -u llmgw-echo -o json --no-pager")).splitlines()
        check(any(json.loads(line).get("MESSAGE") == "hello-journal" for line in lines),
              "journalctl -u -o json has the unit's output")
        restart = await run(c_sd, "systemctl show -p Restart --value llmgw-x")
        check(restart.strip() == "on-failure", "Restart=on-failure set")

        await run(c_plain, "setsid -f sleep 300 </dev/null >/dev/null 2>&1")
        c_plain.close()
        await c_plain.wait_closed()
        c_plain = await connect(plain, key)
        check("sleep 300" in await run(c_plain, "ps -eo args"), "setsid -f survives the session")

        key2 = asyncssh.generate_private_key("ssh-ed25519")
        line = key2.export_public_key().decode().strip()
        await run(c_plain, f"echo '{line}' >> ~/.ssh/authorized_keys")
        async with await connect(plain, key2) as c2:
            check(await run(c2, "echo hi") == "hi\n", "a key appended to ~/.ssh/authorized_keys")

        key3 = asyncssh.generate_private_key("ssh-ed25519")
        sd.authorize_key(key3.export_public_key().decode())
        async with await connect(sd, key3) as c3:
            check(await run(c3, "echo hi") == "hi\n", "a key added with authorize_key()")

        for node in (sd, plain):
            with timed(f"stop_sshd {node.name}"):
                node.stop_sshd()
            try:
                await connect(node, key)
                check(False, f"{node.name}: unreachable after stop_sshd")
            except OSError:
                check(True, f"{node.name}: unreachable after stop_sshd")
            with timed(f"start_sshd {node.name}"):
                node.start_sshd()
            async with await connect(node, key) as conn:
                check(True, f"{node.name}: reachable after start_sshd")
        plain.set_network(False)
        try:
            await connect(plain, key, connect_timeout=1)
            check(False, "plain: unplugged node times out")
        except (asyncio.TimeoutError, OSError) as exc:
            check(isinstance(exc, (asyncio.TimeoutError, TimeoutError)),
                  f"plain: unplugged node times out ({type(exc).__name__})")
        plain.set_network(True)
        async with await connect(plain, key):
            check(True, "plain: replugged node answers")
        check("sleep 300" in plain.exec(["ps", "-eo", "args"]).stdout,
              "plain: daemon outlived sshd")
        check(sd.exec(["systemctl", "is-active", "llmgw-x"]).stdout.strip() == "active",
              "sd: unit outlived sshd")

        for node in (sd, plain):
            old_line = node.known_hosts_line
            with timed(f"set_host_key {node.name}"):
                node.set_host_key()
            check(node.known_hosts_line != old_line, f"{node.name}: host key changed")
            try:
                known = asyncssh.import_known_hosts(old_line + "\n")
                await asyncssh.connect(node.ip, username="root", client_keys=[key],
                                       known_hosts=known)
                check(False, f"{node.name}: old pinned key refused")
            except asyncssh.HostKeyNotVerifiable:
                check(True, f"{node.name}: old pinned key refused")
            async with await connect(node, key):
                check(True, f"{node.name}: new key accepted")
        plain.set_host_key(new=False)
        async with await connect(plain, key):
            check(True, "plain: original host key restored")

        with timed("close (2 nodes)"):
            cluster.close()
        cluster.close()
    after = machine_state()
    shutil.rmtree(workdir)
    for what in before:
        check(after[what] == before[what],
              f"nothing left: {what} (+{sorted(after[what] - before[what])})")


if __name__ == "__main__":
    start = time.monotonic()
    asyncio.run(main())
    TIMINGS["total"] = time.monotonic() - start
    print("timings:")
    for name, seconds in TIMINGS.items():
        print(f"  {name:40} {seconds:6.2f} s")
    print("PASSED")
