"""Add a node, pin its host key, discover what it is, and reach it again later."""
import re
from pathlib import Path

import asyncssh

from ..errors import HostKeyMismatch, LlmgwError, NodeError
from ..executors import ssh
from ..executors.transport import LocalTransport
from ..facts import host
from ..models import Node, utcnow

NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
INSTALL_KEY = ('umask 077; mkdir -p "$HOME/.ssh"; touch "$HOME/.ssh/authorized_keys"; '
               'grep -qxF "$0" "$HOME/.ssh/authorized_keys" || echo "$0" >> "$HOME/.ssh/authorized_keys"')


def check_name(name):
    """Refuse a node name that is not a safe, short DNS-like label."""
    if not NAME.match(name or ""):
        raise LlmgwError(f"{name!r} is not a usable node name: use lower-case letters, digits and "
                         f"dashes, starting with a letter or digit (e.g. gpu-07).")


def parse_addr(addr):
    """Split HOST[:PORT] (or [v6]:PORT) into (host, port)."""
    m = re.match(r"^\[([^\]]+)\](?::(\d+))?$", addr) or re.match(r"^([^:\s]+)(?::(\d+))?$", addr)
    if not m or not re.match(r"^[A-Za-z0-9.:_-]+$", m.group(1)):
        raise LlmgwError(f"--addr {addr!r} is not HOST or HOST:PORT (e.g. 10.0.0.17 or node7:2222).")
    port = int(m.group(2) or 22)
    if not 0 < port < 65536:
        raise LlmgwError(f"port {port} in --addr {addr!r} is out of range 1-65535.")
    return m.group(1), port


def transport_for(node, conf):
    """Return the Transport that reaches a node."""
    if node.transport == "local":
        return LocalTransport(node.name)
    return ssh.SSHTransport(node.name, node.addr, node.port, node.ssh_user,
                            asyncssh.read_private_key(conf["ssh"]["key"]), node.host_key,
                            connect_timeout=conf["ssh"]["connect_timeout"],
                            max_sessions=conf["ssh"]["max_sessions"])


async def discover(transport, base_dir):
    """Run the discovery script on a node and return its facts."""
    result = await transport.check(host.discovery_argv(base_dir), input=host.discovery_script(),
                                   timeout=60, what="discovery")
    try:
        return host.parse_discovery(result.stdout)
    except ValueError as e:
        raise NodeError(transport.name, f"discovery output could not be read: {e}") from e


async def pin_host_key(name, addr, port, existing, repin=False, expected_fp=""):
    """Return (host key line, fingerprint, changed?) after checking it against what was pinned."""
    key = await ssh.fetch_host_key(addr, port)
    fp = ssh.fingerprint(key)
    if expected_fp and fp != expected_fp:
        raise HostKeyMismatch(name, f"{addr}:{port} offers host key {fp}, not the {expected_fp} "
                              f"you gave with --host-key; do not add this node until you know why.")
    if existing and existing.host_key and existing.host_key_fp != fp and not repin:
        raise HostKeyMismatch(name, f"{addr}:{port} now offers host key {fp}, but {existing.host_key_fp} "
                              f"is pinned. If the machine was reinstalled, re-pin it with "
                              f"`flask llmgw add-node {name} --addr {addr}:{port} --repin`.")
    return key, fp


async def install_control_key(name, addr, port, user, host_key, operator_key_path, public_line):
    """Append the control plane's public key to the node's authorized_keys, using the operator's key."""
    path = Path(operator_key_path).expanduser()
    try:
        operator_key = asyncssh.read_private_key(str(path))
    except (OSError, asyncssh.KeyImportError) as e:
        raise LlmgwError(f"--bootstrap-key {path}: cannot read it as an SSH private key ({e}); "
                         f"give an unencrypted private key the node accepts.") from e
    t = ssh.SSHTransport(name, addr, port, user, operator_key, host_key)
    try:
        await t.check(["sh", "-c", INSTALL_KEY, public_line], what="installing the control plane's key")
    finally:
        await t.close()


async def add_node(conf, name, addr, *, user="root", bootstrap_key=None, repin=False,
                   host_key_fp="", base_dir="/opt/llmgw"):
    """Pin, authorise, discover and store a node; return (node, fingerprint, created)."""
    check_name(name)
    host_name, port = parse_addr(addr)
    existing = Node.get_or_none(Node.name == name)
    key, fp = await pin_host_key(name, host_name, port, existing, repin, host_key_fp)
    if bootstrap_key:
        await install_control_key(name, host_name, port, user, key, bootstrap_key,
                                  ssh.public_key_line(conf["ssh"]["key"]))
    node = existing or Node(name=name)
    node.transport, node.addr, node.port, node.ssh_user = "ssh", host_name, port, user
    node.host_key, node.host_key_fp, node.base_dir = key, fp, base_dir
    t = transport_for(node, conf)
    try:
        node.facts = await discover(t, base_dir)
    finally:
        await t.close()
    node.reachable, node.last_seen, node.last_error = True, utcnow(), ""
    node.save()
    return node, fp, existing is None


async def add_local_node(name, base_dir):
    """Store this machine as a node reached without SSH (the demo's node)."""
    check_name(name)
    node = Node.get_or_none(Node.name == name) or Node(name=name)
    node.transport, node.addr, node.port, node.base_dir = "local", "127.0.0.1", 0, base_dir
    node.facts = await discover(LocalTransport(name), base_dir)
    node.reachable, node.last_seen, node.last_error = True, utcnow(), ""
    node.save()
    return node
