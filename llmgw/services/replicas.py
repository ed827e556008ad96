"""Start, adopt, health-check and stop the engine replicas on one node."""
import asyncio

import requests

from ..errors import LlmgwError
from ..models import EngineInstall, Replica, utcnow
from ..facts import ports
from ..plans import launch
from ..plans.placement import free_port
from . import logs, weights

RETRY_FAILED_SECONDS = 30


def endpoint_of(node, port):
    host = node.addr if node.transport != "local" else "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def healthy(endpoint, timeout=3):
    """Return whether an engine answers /health with 200 (run in a thread)."""
    try:
        return requests.get(endpoint + "/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


async def running_units(transport, supervisor, base_dir):
    """Return the replica names whose llmgw-* units run on the node."""
    result = await transport.check(launch.list_argv(supervisor, base_dir), what="listing llmgw-* engines")
    return launch.parse_units(result.stdout)


def _set(replica, state, detail=""):
    replica.state, replica.detail, replica.updated = state, detail, utcnow()
    replica.save()


def _age(replica):
    return (utcnow() - replica.updated).total_seconds()


class NodeReplicas:
    """Brings the replicas recorded for one node to running and healthy."""

    def __init__(self, node, transport, conf):
        self.node, self.t, self.conf = node, transport, conf
        self.supervisor = launch.supervisor_for(node.facts or {})

    async def converge(self, running):
        """Start what is missing, watch what starts, stop orphans; running: names seen running."""
        rows = list(Replica.select().where(Replica.node == self.node))
        wanted = {r.name for r in rows}
        for orphan in sorted(running - wanted):
            await self.t.run(launch.stop_argv(self.supervisor, f"llmgw-{orphan}", self.node.base_dir))
        await asyncio.gather(*(self._one(r, r.name in running) for r in rows),
                             return_exceptions=True)

    async def _one(self, replica, is_running):
        try:
            await self._step(replica, is_running)
        except (LlmgwError, OSError) as e:
            _set(replica, "failed", str(e))

    async def _step(self, replica, is_running):
        if is_running:
            if not replica.supervisor:
                replica.supervisor = self.supervisor
            replica.endpoint = endpoint_of(self.node, replica.port)
            ok = await asyncio.to_thread(healthy, replica.endpoint)
            if ok and replica.state != "ready":
                _set(replica, "ready", f"serving on {replica.endpoint} ({replica.supervisor})")
            elif not ok and replica.state == "ready":
                _set(replica, "unhealthy", f"{replica.endpoint}/health stopped answering")
            elif not ok and replica.state in ("starting", "unhealthy", "pending", "failed"):
                await self._maybe_give_up(replica)
            return
        if replica.state == "failed" and _age(replica) < RETRY_FAILED_SECONDS:
            return
        await self.start(replica)

    async def _maybe_give_up(self, replica):
        limit = self.conf["reconciler"]["health_timeout"]
        if replica.state == "starting" and _age(replica) > limit:
            tail, _ = await logs.read(self.t, replica.supervisor, self.node.base_dir, replica.unit, 5)
            await self.stop(replica)
            _set(replica, "failed", f"not healthy after {limit} s; last lines: "
                                    + " | ".join(line["text"] for line in tail[-3:]))
        elif replica.state in ("pending", "failed"):
            _set(replica, "starting", "found its engine running; waiting for /health")

    async def start(self, replica):
        """Fetch the weights and launch the replica's engine under the node's supervisor."""
        model = replica.model
        install = EngineInstall.get_or_none(node=self.node, engine=model.engine)
        if install is None or install.state != "ready":
            _set(replica, "pending", f"waiting for {model.engine} to be ready on {self.node.name}")
            return
        _set(replica, "fetching", f"copying {model.name}'s file to {self.node.name}")
        path = await weights.ensure_on_node(self.t, self.node.base_dir, model,
                                            self.conf["engines"]["cache"])
        await self.t.run(launch.stop_argv(self.supervisor, replica.unit, self.node.base_dir))
        await self._take_free_port(replica)
        # The control plane reaches a local node on loopback; nothing else should.
        host = "127.0.0.1" if self.node.transport == "local" else "0.0.0.0"
        argv = launch.engine_argv(model.engine, install.binary, path, model.name, replica.port,
                                  model.args or [], host)
        await self.t.check(launch.start_argv(self.supervisor, replica.unit, argv, self.node.base_dir),
                           what=f"starting {replica.unit}")
        replica.supervisor = self.supervisor
        replica.endpoint = endpoint_of(self.node, replica.port)
        _set(replica, "starting", f"started as {replica.unit} under {self.supervisor}; waiting for /health")

    async def _take_free_port(self, replica):
        """Move the replica to another port when something else on the node listens on its own."""
        listening = ports.parse_listening((await self.t.run(ports.LISTEN_ARGV)).stdout)
        if replica.port not in listening:
            return
        taken = {r.port for r in Replica.select().where(Replica.node == self.node)} | listening
        replica.port = free_port(taken, self.conf["reconciler"]["port_range"])
        replica.save()

    async def stop(self, replica):
        await self.t.run(launch.stop_argv(replica.supervisor or self.supervisor, replica.unit,
                                          self.node.base_dir))

