"""`flask llmgw add-node | remove-node | discover | engine-check | nodes | logs | endpoint`."""
import asyncio
import datetime
import os

import click

from ..errors import LlmgwError
from ..models import Endpoint, Node, NodeEvent, Replica
from ..plans.launch import supervisor_for
from ..plans.nodespec import parse_duration
from ..services import logs as logsvc
from ..services import cards, collect, endpoints, install, lifecycle, nodes
from ..plans.sizing import human_bytes
from . import conf, echo_json, llmgw, root_option, run_async, table


@llmgw.command("add-node")
@click.argument("name")
@click.option("--addr", required=True,
              help="HOST[:PORT] of the node's sshd; several separated by commas are tried in order.")
@click.option("--user", default="root", show_default=True,
              help="SSH user on the node; any other than root runs commands with sudo -n.")
@click.option("--bootstrap-key", type=click.Path(dir_okay=False),
              help="Your own private key the node already accepts; used once to install the "
                   "control plane's key.")
@click.option("--password", "ask_password", is_flag=True,
              help="Prompt for the user's SSH password instead, used once and never stored.")
@click.option("--use-agent", is_flag=True,
              help="Install the key with the keys in your ssh-agent (SSH_AUTH_SOCK) instead.")
@click.option("--host-key", "host_key_fp", default="",
              help="The node's host key fingerprint (SHA256:…), checked before anything is sent.")
@click.option("--repin", is_flag=True, help="Accept a changed host key (after a reinstall).")
@click.option("--base-dir", default="/opt/llmgw", show_default=True,
              help="Where llmgw keeps engines, models and logs on the node.")
@click.option("--label", "labels", multiple=True, help="key=value, repeatable (e.g. --label gpu=fast).")
@click.option("--fabric", default="", help="NAME[:hca1,hca2]: the interconnect this node is on.")
@click.option("--mgmt-iface", default="", help="The node's management network interface.")
@root_option
def add_node(name, addr, user, bootstrap_key, ask_password, use_agent, host_key_fp, repin, base_dir,
             labels, fabric, mgmt_iface):
    """Pin a node's host key, authorise the control plane, discover it and store it."""
    spec = nodes.NodeSpec.parse(name, addr, user, base_dir, labels, fabric, mgmt_iface)
    password = click.prompt(f"SSH password of {user}@{spec.addrs[0][0]}", hide_input=True) \
        if ask_password else None
    agent = os.environ.get("SSH_AUTH_SOCK") if use_agent else None
    if use_agent and not agent:
        raise LlmgwError("--use-agent: SSH_AUTH_SOCK is not set, so there is no agent to ask; "
                         "start one (eval $(ssh-agent); ssh-add) or use --bootstrap-key.")
    node, fp, created = run_async(nodes.add_node(
        conf(), spec, bootstrap_key=bootstrap_key, password=password, agent_path=agent, repin=repin,
        host_key_fp=host_key_fp))
    f = node.facts
    click.echo(f"{'added' if created else 'updated'} {name} ({node.addr}:{node.port})")
    click.echo(f"  host key   {fp} (pinned)")
    click.echo(f"  system     {f['os'].get('pretty') or f['os'].get('id')} {f['arch']}, "
               f"{f['memory'].get('total_mb', '?')} MB RAM, {f['disk'].get('free_mb', '?')} MB free")
    click.echo(f"  cpu        {', '.join(f['cpu_flags']) or 'no vector extensions'}")
    click.echo(f"  nvidia     {f['nvidia_driver'] or 'no driver loaded'}")
    for g in f.get("gpus", []):
        state = "healthy" if g["healthy"] else f"UNHEALTHY: {g['reason']}"
        click.echo(f"  gpu {g['index'] if g['index'] is not None else '?'}      {g['name'] or g['bus_id']} "
                   f"{g['class']} {state}")
    for p in f.get("infiniband", []):
        click.echo(f"  ib         {p['hca']} port {p['port']} {p['state']} {p['rate']}")
    click.echo(f"  engines    run under {supervisor_for(f)}"
               + (f" (commands via sudo as {user})" if node.use_sudo else ""))


@llmgw.command("remove-node")
@click.argument("name")
@click.option("--force", is_flag=True, help="Forget the node even when its engines cannot be stopped.")
@root_option
def remove_node(name, force):
    """Stop a node's engines, then forget the node."""
    node = _node(name)
    stopped = run_async(nodes.remove_node(conf(), node, force))
    click.echo(f"removed {name}" + (f"; stopped {', '.join('llmgw-' + u for u in sorted(stopped))}"
                                    if stopped else "; no engine was running there"))


@llmgw.command("discover")
@click.argument("name")
@root_option
def discover(name):
    """Discover a node again now, and print what changed."""
    node = _node(name)
    before = node.events.count()
    t = nodes.transport_for(node, conf())

    async def go():
        try:
            return await nodes.rediscover(node, t)
        finally:
            await t.close()
    run_async(go())
    new = list(node.events.order_by(NodeEvent.id).offset(before))
    click.echo(f"discovered {name}: " + ("; ".join(e.text for e in new) if new else "nothing changed"))


@llmgw.command("engine-check")
@click.argument("name")
@click.argument("engine", type=click.Choice(["vllm", "sglang"]))
@click.argument("path")
@root_option
def engine_check(name, engine, path):
    """Probe an engine llmgw does not install (vLLM: its binary; SGLang: its python) on a node."""
    if not path.startswith("/"):
        raise LlmgwError(f"{path!r} is not an absolute path on the node.")
    t = nodes.transport_for(_node(name), conf())

    async def go():
        try:
            return await install.probe(t, engine, path)
        finally:
            await t.close()
    ok, sentence = run_async(go())
    if not ok:
        raise LlmgwError(sentence)
    click.echo(f"{name}: {sentence}; name it under [node_engines.{name}] as {engine} = \"{path}\"")


def _node(name):
    node = Node.get_or_none(Node.name == name)
    if node is None:
        known = ", ".join(n.name for n in Node.select(Node.name).order_by(Node.name)) or "none yet"
        raise LlmgwError(f"no node called {name!r} (nodes: {known}); `flask llmgw nodes` lists them.")
    return node


@llmgw.command("cordon")
@click.argument("name")
@root_option
def cordon(name):
    """Place no new replicas on a node; those running there stay."""
    click.echo(lifecycle.cordon(_node(name), True))


@llmgw.command("uncordon")
@click.argument("name")
@root_option
def uncordon(name):
    """Let new replicas be placed on a cordoned, draining or drained node again."""
    click.echo(lifecycle.cordon(_node(name), False))


@llmgw.command("drain")
@click.argument("name")
@click.option("--timeout", default="10m", show_default=True,
              help="How long each replica's requests are given once its replacement serves.")
@root_option
def drain(name, timeout):
    """Move a node's replicas to other nodes without failing a request, then stop them there."""
    try:
        seconds = parse_duration(timeout, "--timeout")
    except ValueError as e:
        raise LlmgwError(str(e)) from None
    click.echo(lifecycle.drain(_node(name), seconds))


@llmgw.command("weights")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@click.option("--collect", "now", is_flag=True, help="Delete now what weights.keep_unused allows.")
@root_option
def weights_cmd(name, as_json, now):
    """List the weights under a node's <base>/models: size, last used, by whom, kept or not."""
    node, c = _node(name), conf()
    keep = c["weights"]["keep_unused_seconds"]
    t = nodes.transport_for(node, c)

    async def go():
        try:
            verdicts = await collect.look(node, t, keep)
            gone = await collect.collect(node, t, verdicts, keep) if now else []
            return verdicts, gone
        finally:
            await t.close()
    verdicts, gone = run_async(go())
    rows = [{"name": v.entry.name, "bytes": v.entry.size, "last_used": _when(v.last_used),
             "in_use_by": list(v.users), "collectable": v.collect, "why": v.why,
             "collected": v.entry.name in gone} for v in verdicts]
    if as_json:
        return echo_json(rows)
    table(rows, [("ENTRY", lambda r: r["name"]), ("SIZE", lambda r: human_bytes(r["bytes"])),
                 ("LAST USED", lambda r: r["last_used"]),
                 ("STATE", lambda r: "collected" if r["collected"] else "collectable" if r["collectable"] else "kept"),
                 ("WHY", lambda r: r["why"])],
          f"{name}: nothing under {collect.models_dir(node)}")


def _when(epoch):
    return datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


@llmgw.command("nodes")
@click.option("--json", "as_json", is_flag=True)
@root_option
def list_nodes(as_json):
    """List nodes with their reachability, engine installs and replicas."""
    out = []
    for n in Node.select().order_by(Node.name):
        out.append({"name": n.name, "addr": n.addr, "port": n.port, "reachable": n.reachable,
                    "state": n.shown_state, "lost_since": n.lost_since.isoformat() if n.lost_since else None,
                    "last_seen": n.last_seen.isoformat() if n.last_seen else None,
                    "labels": n.labels or {}, "fabric": n.fabric, "user": n.ssh_user,
                    "last_error": n.last_error, "host_key": n.host_key_fp,
                    "supervisor": supervisor_for(n.facts or {}),
                    "installs": [{"engine": i.engine, "version": i.version, "variant": i.variant,
                                  "state": i.state, "detail": i.detail} for i in n.installs],
                    "gpus": cards.node_cards(n),
                    "replicas": [{"name": r.name, "state": r.state, "endpoint": r.endpoint,
                                  "load": r.load, "detail": r.detail} for r in n.replicas]})
    if as_json:
        return echo_json(out)
    if not out:
        click.echo("no nodes yet: `llmgw add-node NAME --addr HOST` adds one")
        return
    click.echo(f"{'NODE':<16} {'STATE':<9} ADDRESS  REACHABLE")
    for n in out:
        click.echo(f"{n['name']:<16} {n['state']:<9} {n['addr']}:{n['port']}  "
                   f"{'reachable' if n['reachable'] else 'UNREACHABLE ' + n['last_error']}")
        for i in n["installs"]:
            click.echo(f"    {i['engine']} {i['version']}: {i['state']}  {i['detail']}")
        for g in n["gpus"]:
            health = "healthy" if g["healthy"] else f"UNHEALTHY: {g['reason']}"
            click.echo(f"    GPU {g['index'] if g['index'] is not None else '?'} {g['class'] or g['bus_id']} "
                       f"{g['uuid']} {health}; {', '.join(g['claimed_by']) or 'free'}")
        for r in n["replicas"]:
            click.echo(f"    replica {r['name']}: {r['state']}  {r['detail']}")


FOLLOW_SECONDS = 1


@llmgw.command("logs")
@click.argument("node_name", metavar="NODE")
@click.option("--source", default="", help="A replica on the node (default: every replica there).")
@click.option("-n", "lines", default=50, show_default=True, type=click.IntRange(1, 100000))
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines as they come (Ctrl-C stops).")
@root_option
def logs(node_name, source, lines, follow):
    """Print the newest log lines of a node's engines (journald, or the fallback's log file)."""
    node = _node(node_name)
    reps = list(Replica.select().where(Replica.node == node).order_by(Replica.name))
    if source:
        reps = [r for r in reps if r.name == source]
        if not reps:
            raise LlmgwError(f"{node_name} runs no replica called {source!r}.")
    if not reps:
        raise LlmgwError(f"{node_name} runs no engine yet, so there are no logs to show.")
    t = nodes.transport_for(node, conf())

    sup = supervisor_for(node.facts or {})

    async def read_all():
        cursors = {}
        try:
            while True:
                for r in reps:
                    got, cursors[r.name] = await logsvc.read(t, r.supervisor or sup, node.base_dir, r.unit,
                                                             lines if r.name not in cursors else 10000,
                                                             cursors.get(r.name, ""))
                    for line in got:
                        prefix = f"{line['ts']} " if line["ts"] else ""
                        click.echo(f"{r.unit}: {prefix}{line['text']}")
                if not follow:
                    return
                await asyncio.sleep(FOLLOW_SECONDS)
        finally:
            await t.close()
    try:
        run_async(read_all())
    except KeyboardInterrupt:
        pass  # --follow ends with Ctrl-C: no traceback



@llmgw.group("endpoint")
def endpoint():
    """OpenAI-compatible servers llmgw routes to but does not run."""


@endpoint.command("add")
@click.argument("name")
@click.option("--url", required=True, help="Its OpenAI base URL, e.g. http://10.0.0.5:8000/v1.")
@click.option("--model", "models", required=True, help="The model name(s) it serves, comma-separated.")
@click.option("--api-key", "ask_key", is_flag=True, help="Prompt for its API key (stored encrypted).")
@root_option
def endpoint_add(name, url, models, ask_key):
    """Register an external endpoint; the reconciler health-checks it before it is routed to."""
    key = click.prompt("API key", hide_input=True) if ask_key else ""
    row = endpoints.add(conf()["_root"], name, url, models, key)
    click.echo(f"endpoint {row.name}: {row.url} serving {', '.join(row.models)}"
               + (" (key stored encrypted)" if key else ""))


@endpoint.command("list")
@click.option("--json", "as_json", is_flag=True)
@root_option
def endpoint_list(as_json):
    """List external endpoints and their health."""
    rows = [{"name": e.name, "url": e.url, "models": e.models, "state": e.state, "detail": e.detail}
            for e in Endpoint.select().order_by(Endpoint.name)]
    if as_json:
        return echo_json(rows)
    table(rows, [("ENDPOINT", lambda r: r["name"]), ("STATE", lambda r: r["state"]), ("URL", lambda r: r["url"]),
                 ("MODELS", lambda r: r["models"]), ("DETAIL", lambda r: r["detail"])],
          "no endpoints: `llmgw endpoint add NAME --url URL --model M` routes to a server llmgw does not run")


@endpoint.command("remove")
@click.argument("name")
@root_option
def endpoint_remove(name):
    """Forget an external endpoint; the gateway stops routing to it within seconds."""
    row = endpoints.remove(name)
    click.echo(f"removed endpoint {row.name} ({row.url}); its models {', '.join(row.models)} are no "
               f"longer routed there")
