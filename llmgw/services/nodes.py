"""Add, re-discover and remove nodes; reach them again later."""
from dataclasses import dataclass, field
from pathlib import Path

import asyncssh

from ..errors import HostKeyMismatch, LlmgwError, NodeError
from ..executors import ssh
from ..executors.transport import LocalTransport
from ..facts import changes, gpu, host
from ..models import Node, Replica, database, utcnow
from ..plans import launch, nodespec
from .lifecycle import log_event
from .replicas import units_on

INSTALL_KEY = ('umask 077; mkdir -p "$HOME/.ssh"; touch "$HOME/.ssh/authorized_keys"; '
               'grep -qxF "$0" "$HOME/.ssh/authorized_keys" || echo "$0" >> "$HOME/.ssh/authorized_keys"')


@dataclass
class NodeSpec:
    """What the operator said about a node on the command line, checked."""

    name: str
    addrs: list
    user: str = "root"
    base_dir: str = "/opt/llmgw"
    labels: dict = field(default_factory=dict)
    fabric: str = ""
    fabric_hcas: list = field(default_factory=list)
    mgmt_interface: str = ""

    @classmethod
    def parse(cls, name, addr, user="root", base_dir="/opt/llmgw", labels=(), fabric="", mgmt_iface=""):
        try:
            fab, hcas = nodespec.parse_fabric(fabric)
            spec = cls(nodespec.check_name(name), nodespec.parse_addrs(addr), user, base_dir,
                       nodespec.parse_labels(labels), fab, hcas, nodespec.check_iface(mgmt_iface))
        except nodespec.SpecError as e:
            raise LlmgwError(str(e)) from e
        if not base_dir.startswith("/"):
            raise LlmgwError(f"--base-dir {base_dir!r} must be an absolute path on the node.")
        return spec


def addrs_of(node):
    if node.addrs:
        return [tuple(a) for a in node.addrs]
    return [(node.addr, node.port)]


def control_key(conf):
    """Read the control plane's SSH identity, or say how to make one."""
    path = conf["ssh"]["key"]
    try:
        return asyncssh.read_private_key(path)
    except (OSError, asyncssh.KeyImportError) as e:
        raise LlmgwError(f"cannot read the control plane's SSH key {path} ({e}); run "
                         f"`flask llmgw init` with the same --root to make one, or fix ssh.key.") from e


def transport_for(node, conf):
    """Return the Transport that reaches a node."""
    if node.transport == "local":
        return LocalTransport(node.name)
    return ssh.SSHTransport(node.name, addrs_of(node), node.ssh_user,
                            control_key(conf), node.host_key,
                            connect_timeout=conf["ssh"]["connect_timeout"],
                            max_sessions=conf["ssh"]["max_sessions"], sudo=node.use_sudo,
                            command_timeout=conf["ssh"]["command_timeout"])


async def discover(transport, base_dir):
    """Run the discovery script on a node and return its facts."""
    result = await transport.check(host.discovery_argv(base_dir), input=host.discovery_script(),
                                   timeout=60, what="discovery")
    try:
        return host.parse_discovery(result.stdout)
    except ValueError as e:
        raise NodeError(transport.name, f"discovery output could not be read: {e}") from e


async def rediscover(node, transport):
    """Discover again, log what changed on the node's own log, and store the facts."""
    facts = await discover(transport, node.base_dir)
    for sentence in changes.describe(node.facts or {}, facts):
        log_event(node, sentence)
    node.facts, node.discovered = facts, utcnow()
    node.save(only=[Node.facts, Node.discovered])  # never undo an add-node made meanwhile
    return node


async def check_gpus(node, transport):
    """Ask nvidia-smi again (cheaper than a discovery); log cards turning sick or well, store."""
    result = await transport.run(gpu.QUERY_ARGV, timeout=30)
    if not result.ok and not result.stdout.strip():
        return node  # nvidia-smi itself failed: the next discovery says what is wrong
    gpus = gpu.parse_gpus(result.stdout + "\n" + result.stderr)
    facts = dict(node.facts or {}, gpus=gpus)
    for sentence in changes.describe(node.facts or {}, facts):
        log_event(node, sentence)
    # Written when what placement reads changed, not for every new temperature or memory
    # reading (those are refreshed by the five-minute discovery).
    if [_placed_by(g) for g in gpus] != [_placed_by(g) for g in (node.facts or {}).get("gpus", [])]:
        node.facts = facts
        node.save(only=[Node.facts])
    return node


def _placed_by(card):
    return {k: card.get(k) for k in ("uuid", "index", "class", "memory_mib", "healthy", "reason")}


async def pin_host_key(name, addr, port, existing, repin=False, expected_fp=""):
    """Return (host key line, fingerprint) after checking it against what was pinned."""
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


async def _pin_first_answering(spec, existing, repin, host_key_fp):
    """Pin the host key offered at the first address that answers; return it and that address.

    That address is also where the control plane reaches the node's engines.
    """
    errors = []
    for host_name, port in spec.addrs:
        try:
            key, fp = await pin_host_key(spec.name, host_name, port, existing, repin, host_key_fp)
            return key, fp, host_name, port
        except HostKeyMismatch:
            raise
        except NodeError as e:
            errors.append(str(e))
    raise NodeError(spec.name, "no address answered: " + "; ".join(errors))


async def install_control_key(spec, host_key, public_line, operator_key_path=None, password=None,
                              agent_path=None):
    """Append the control plane's public key to the node user's authorized_keys, once."""
    operator_key = None
    if operator_key_path:
        path = Path(operator_key_path).expanduser()
        try:
            operator_key = asyncssh.read_private_key(str(path))
        except (OSError, asyncssh.KeyImportError) as e:
            raise LlmgwError(f"--bootstrap-key {path}: cannot read it as an SSH private key ({e}); "
                             f"give an unencrypted private key the node accepts.") from e
    t = ssh.SSHTransport(spec.name, spec.addrs, spec.user, operator_key, host_key, password=password,
                         agent_path=agent_path)
    try:
        await t.check(["sh", "-c", INSTALL_KEY, public_line], what="installing the control plane's key")
    finally:
        await t.close()


async def add_node(conf, spec, *, bootstrap_key=None, password=None, agent_path=None, repin=False,
                   host_key_fp=""):
    """Pin, authorise, discover and store a node; return (node, fingerprint, created)."""
    existing = Node.get_or_none(Node.name == spec.name)
    key, fp, first_host, first_port = await _pin_first_answering(spec, existing, repin, host_key_fp)
    if bootstrap_key or password or agent_path:
        public = control_key(conf).export_public_key().decode().strip()
        await install_control_key(spec, key, public, bootstrap_key, password, agent_path)
    node = existing or Node(name=spec.name)
    node.transport, node.addr, node.port = "ssh", first_host, first_port
    node.addrs = [list(a) for a in spec.addrs]
    node.ssh_user, node.use_sudo, node.base_dir = spec.user, spec.user != "root", spec.base_dir
    node.labels, node.fabric, node.fabric_hcas = spec.labels, spec.fabric, spec.fabric_hcas
    node.mgmt_interface = spec.mgmt_interface
    changed_key = existing is not None and existing.host_key_fp not in ("", fp)
    node.host_key, node.host_key_fp = key, fp
    t = transport_for(node, conf)
    try:
        facts = await discover(t, spec.base_dir)
    finally:
        await t.close()
    with database.atomic():
        node.reachable, node.last_seen, node.last_error = True, utcnow(), ""
        old, node.facts, node.discovered = node.facts if existing else {}, facts, utcnow()
        node.save()
        log_event(node, f"host key re-pinned: {fp}" if changed_key else
                  ("added" if existing is None else "updated") + f" with host key {fp}")
        for sentence in changes.describe(old, facts):
            log_event(node, sentence)
    return node, fp, existing is None


async def add_local_node(name, base_dir):
    """Store this machine as a node reached without SSH (the demo's node)."""
    try:
        nodespec.check_name(name)
    except nodespec.SpecError as e:
        raise LlmgwError(str(e)) from e
    node = Node.get_or_none(Node.name == name) or Node(name=name)
    node.transport, node.addr, node.port, node.base_dir = "local", "127.0.0.1", 0, base_dir
    node.facts = await discover(LocalTransport(name), base_dir)
    node.reachable, node.last_seen, node.last_error, node.discovered = True, utcnow(), "", utcnow()
    node.save()
    return node


async def stop_engines(conf, node):
    """Stop every llmgw engine on the node (crash-looping ones too); return the units stopped.
    Raises NodeError when the node cannot be reached."""
    t = transport_for(node, conf)
    try:
        sup = launch.supervisor_for(node.facts or {})
        units = set(await units_on(t, sup, node.base_dir))
        for name in sorted(units):
            await t.check(launch.stop_argv(sup, f"llmgw-{name}", node.base_dir),
                          what=f"stopping llmgw-{name}")
        return units
    finally:
        await t.close()


async def remove_node(conf, node, force=False):
    """Stop every llmgw engine on the node, then forget it; return the units stopped."""
    try:
        units = await stop_engines(conf, node)
    except NodeError as e:
        if not force:
            raise LlmgwError(f"{node.name} cannot be reached to stop its engines ({e}); they would "
                             f"keep running. Bring it back, or remove it anyway with --force.") from e
        units = set()
    with database.atomic():
        Replica.delete().where(Replica.node == node).execute()
        node.delete_instance(recursive=True)
    return units

