"""Start, adopt, health-check and stop the engine replicas on one node."""
import asyncio
import hashlib
import json
import logging
import secrets

import peewee as pw

from .. import secrets_box
from ..errors import LlmgwError, NodeError
from ..executors.probes import probe
from ..facts import ports
from ..models import Endpoint, EngineInstall, Node, NodeEvent, Replica, utcnow
from ..plans import launch
from ..plans.placement import free_port
from ..plans.replica_state import LEAVING, next_step, retry_delay
from . import logs, weights
from .engine_http import endpoint_of, engine_load, healthy, probe_key
from .progress import Progress
from .serving import serve_of

log = logging.getLogger("llmgw.replicas")


async def units_on(transport, supervisor, base_dir):
    """Return {replica name: state} of our llmgw-* units on the node, in any state."""
    result = await transport.check(launch.list_argv(supervisor, base_dir), what="listing llmgw-* engines")
    return launch.parse_units(result.stdout)


async def running_units(transport, supervisor, base_dir):
    """Return the replica names whose llmgw-* units run on the node."""
    units = await units_on(transport, supervisor, base_dir)
    return {name for name, state in units.items() if state == "active"}


async def check_over_http(rows, conf):
    """Health-check replicas of a node SSH cannot reach: engines may well still serve.

    Returns whether any engine there answered: a node whose engines answer is not lost.
    """
    answered = False
    for r in rows:
        if r.state in ("ready", "unhealthy", "draining") and r.endpoint:
            ok = await probe(healthy, r.endpoint, probe_key(conf, r))
            answered = answered or ok
            if ok and r.state == "unhealthy":
                _set(r, "ready", f"serving on {r.endpoint} (its node is unreachable over SSH)")
            elif not ok and r.state == "ready":
                _set(r, "unhealthy", f"{r.endpoint}/health stopped answering, and its node is "
                                     f"unreachable over SSH")
            elif not ok and r.state == "draining":
                # Out of routing; it is stopped for good when its node answers SSH again.
                _set(r, "stopping", f"leaving: {r.endpoint}/health stopped answering while it "
                                    f"was draining, and its node is unreachable over SSH")
    return answered


_model_locks = {}


def spec_of(model, install, replica):
    """Return a digest of everything a replica's engine is started from, its cards included.

    The parts added for GPUs and context count only when set, so a CPU replica started before
    they existed keeps its digest and is not restarted by an upgrade.
    """
    parts = [model.engine, model.source, model.sha256, model.args or [], install.binary]
    pinned = [list(replica.gpu_uuids or []), replica.gpu_memory_mb, model.context, model.on_nodes]
    if any(pinned):
        parts.append(pinned)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _set(replica, state, detail="", **fields):
    """Write a replica's state while it is still where this task saw it; return whether it was.

    A task may hold its row for minutes (a model file being copied) while placement moves the
    replica to other cards or another node: a write from that old view must not undo the move.
    """
    values = dict(state=state, detail=detail, updated=utcnow(), **fields)
    was = replica.state
    where = _still_there(replica)
    if state not in LEAVING:
        # A row on its way out never comes back to serve: its slot has, or gets, another row.
        where &= Replica.state.not_in(LEAVING)
    written = Replica.update(**values).where(where).execute()
    if written:
        for k, v in values.items():
            setattr(replica, k, v)
        if state != was and state in LOGGED_STATES:
            NodeEvent.create(node=replica.node_id, text=f"{replica.name} {state}: {detail}")
    return bool(written)


# Why a replica leaves routing to restart, in its detail while it is 'restarting'.
RESTART_FOR = {"settings": "to restart on the model's new settings",
               "key": "to restart with an API key of its own"}

# The replica states a node's history records when a replica enters them.
LOGGED_STATES = ("starting", "ready", "unhealthy", "failed")


def _still_there(replica):
    where = ((Replica.id == replica.id) & (Replica.node == replica.node_id)
             # A list compared with == would be read as IN (…): one JSON value it is.
             & (Replica.gpu_uuids == pw.Value(list(replica.gpu_uuids or []), unpack=False))
             & (Replica.gpu_memory_mb == replica.gpu_memory_mb))
    if replica.state not in LEAVING:
        # Told to leave since this task read it: its start must not bring it back.
        where &= Replica.state.not_in(LEAVING)
    return where


def _anything_sealed():
    return (Replica.select().where(Replica.engine_key != "").exists()
            or Endpoint.select().where(Endpoint.api_key != "").exists())


def _age(replica):
    return (utcnow() - replica.updated).total_seconds()


class NodeReplicas:
    """Brings the replicas recorded for one node to running and healthy."""

    def __init__(self, node, transport, conf):
        self.node, self.t, self.conf = node, transport, conf
        self.supervisor = launch.supervisor_for(node.facts or {})

    async def look(self):
        """List what runs now (never a listing older than this moment), stopping orphans.

        Returns (running names, replica rows of this node).
        """
        units = await units_on(self.t, self.supervisor, self.node.base_dir)
        running = {name for name, state in units.items() if state == "active"}
        rows = list(Replica.select().where(Replica.node == self.node))
        # An orphan is stopped whatever its state: one crash-looping under systemd is mostly
        # 'activating', and would otherwise restart for ever.
        for orphan in sorted(set(units) - {r.name for r in rows}):
            await self.t.run(launch.stop_argv(self.supervisor, f"llmgw-{orphan}", self.node.base_dir))
            NodeEvent.create(node=self.node, text=f"stopped llmgw-{orphan} ({units[orphan]}): no "
                                                  f"replica of that name is placed here any more")
        return running, rows

    async def one(self, replica, is_running):
        """Take one replica one step further; its trouble is its own row, never the pass's."""
        try:
            await self._step(replica, is_running)
        except NodeError as e:
            if replica.state in ("ready", "unhealthy", *LEAVING):
                # SSH trouble says nothing about the engine, which HTTP still checks.
                log.warning("replica %s: %s", replica.name, e)
                return
            _set(replica, "failed", str(e), failures=replica.failures + 1)
        except Exception as e:
            if not isinstance(e, (LlmgwError, OSError)):
                log.exception("replica %s", replica.name)
            if replica.state in LEAVING:
                log.warning("replica %s (%s): %s", replica.name, replica.state, e)
                return  # tried again next pass; it never turns 'failed' and so back into a slot
            _set(replica, "failed", str(e) or type(e).__name__, failures=replica.failures + 1)

    async def back(self, units):
        """Stop every engine a node still runs after it was lost, and forget its rows.

        Its replicas were placed elsewhere meanwhile (the rows left here are 'lost'), so an
        engine found here is a stale copy: stopped before the node takes any new replica, never
        adopted, whatever its name.
        """
        for name, state in sorted(units.items()):
            await self.t.check(launch.stop_argv(self.supervisor, f"llmgw-{name}", self.node.base_dir),
                               what=f"stopping the stale llmgw-{name}")
        gone = Replica.delete().where(Replica.node == self.node).execute()
        since = self.node.lost_since
        Node.update(lost_since=None).where(Node.id == self.node.id).execute()
        self.node.lost_since = None
        stale = ", ".join(f"llmgw-{n}" for n in sorted(units)) or "none"
        NodeEvent.create(node=self.node, text=(
            f"back after being lost since {since:%Y-%m-%d %H:%M:%S} UTC; stale engines stopped: "
            f"{stale}; {gone} replica row(s) it held were forgotten; it takes new replicas again"))

    async def _step(self, replica, is_running):
        if replica.state == "draining":
            await self._drain_step(replica, is_running)
            return
        if replica.state in ("stopping", "restarting"):
            await self._stop_when_done(replica, is_running)
            return
        if replica.state == "moving":
            # Its cards were taken from it (one turned unhealthy, or the model needs others):
            # stop it now, not when it is its turn to restart, then start it on its new claim.
            if is_running:
                await self.stop(replica)
            await self.start(replica)
            return
        if is_running and await self._restart_if_changed(replica):
            return
        ok = False
        if is_running:
            replica.endpoint = endpoint_of(self.node, replica.port)
            ok = await probe(healthy, replica.endpoint, probe_key(self.conf, replica))
        if ok:
            load = await probe(engine_load, replica.endpoint, probe_key(self.conf, replica))
            if load != replica.load:
                replica.load = load
                replica.save(only=[Replica.load])
        limit = self.conf["reconciler"]["health_timeout"]
        action = next_step(replica.state, is_running, ok, _age(replica), limit, replica.failures)
        if action == "ready":
            _set(replica, "ready", f"serving on {replica.endpoint} ({replica.supervisor or self.supervisor})",
                 failures=0, supervisor=replica.supervisor or self.supervisor)
        elif action == "unhealthy":
            _set(replica, "unhealthy", f"{replica.endpoint}/health stopped answering")
        elif action == "adopt" and not replica.spec:
            # Running under this name, but never started for this row: a stale engine left
            # by a replica of the same name (a model removed and added again while its node
            # was out of reach). Started afresh, never adopted.
            await self.stop(replica)
            NodeEvent.create(node=self.node, text=f"stopped a stale {replica.unit} that this row "
                                                  f"never started; starting it afresh")
            await self.start(replica)
        elif action == "adopt":
            _set(replica, "starting", "found its engine running; waiting for /health",
                 supervisor=replica.supervisor or self.supervisor)
        elif action == "give_up":
            tail = await self._tail(replica)
            await self.stop(replica)
            self._fail(replica, f"not healthy after {limit} s", tail)
        elif action == "crashed":
            self._fail(replica, "its engine exited", await self._tail(replica))
        elif action == "start":
            await self.start(replica)

    async def _drain_step(self, replica, is_running):
        """Serve on until the slot's replacement is ready, then leave like any stopping replica."""
        successor = (Replica.select(Replica, Node).join(Node)
                     .where((Replica.slot == replica.slot) & (Replica.id != replica.id)
                            & (Replica.state == "ready")).first())
        if successor is not None:
            _set(replica, "stopping", f"leaving: {successor.name} on {successor.node.name} serves in "
                                      f"its place; stopped once its requests are done")
            return
        if not is_running or not await probe(healthy, replica.endpoint, probe_key(self.conf, replica)):
            # Out of routing at once; it is not restarted here, its replacement is coming.
            _set(replica, "stopping", "leaving: its engine stopped serving while it was draining")

    async def _stop_when_done(self, replica, is_running):
        """Stop a leaving replica once its engine says it is idle, or its grace is over.

        It left routing when it became 'stopping' (scaled away: then forgotten) or
        'restarting' (started again on the model's new settings). The gateway workers' route
        caches may still send it a request for route_cache_seconds: never stopped before that.
        """
        why = await self._until_done(replica, is_running)
        if why is None:
            return
        if replica.state == "restarting":
            keyless = RESTART_FOR["key"] in replica.detail
            purpose = "to give its engine an API key" if keyless else "to apply the model's new settings"
            if _set(replica, "pending", f"restarting {purpose}; {why}"):
                NodeEvent.create(node=self.node, text=f"stopped {replica.name} {purpose}; {why}")
            return
        gone = Replica.delete().where(_still_there(replica) & (Replica.state == "stopping")).execute()
        if gone:
            reason = replica.detail.removeprefix("leaving: ").split("; stopped once")[0]
            NodeEvent.create(node=self.node, text=f"stopped {replica.name} ({reason}); {why}")

    async def _until_done(self, replica, is_running):
        """Stop the engine once it is idle or out of grace; return why, or None to wait on."""
        grace = self.conf["reconciler"]["stop_grace"]
        if self.node.state == "draining" and self.node.drain_timeout:
            grace = self.node.drain_timeout  # what the operator gave the drain
        settle = self.conf["gateway"]["route_cache_seconds"] + 1
        if not is_running:
            return "it was not running"
        age = _age(replica)
        if age < settle:
            return None
        load = await probe(engine_load, replica.endpoint, probe_key(self.conf, replica)) \
            if replica.endpoint else None
        if age < grace and load != 0:
            return None  # serving requests still, or it cannot say: wait for the grace
        await self.stop(replica)
        return "its requests done" if load == 0 else f"its {grace} s grace over ({load} requests left)"

    async def _restart_if_changed(self, replica):
        """Take a replica started from an older model or engine out of routing to restart it,
        one of a model at a time; it is stopped once its requests are done."""
        install = EngineInstall.get_or_none(node=self.node, engine=replica.model.engine)
        if not replica.spec or install is None or install.state != "ready":
            return False
        if replica.spec != spec_of(replica.model, install, replica):
            why = RESTART_FOR["settings"]
        elif not replica.engine_key:
            # Started before engines had keys: it answers anyone who reaches its port.
            why = RESTART_FOR["key"]
        else:
            return False
        lock = _model_locks.setdefault(replica.model_id, asyncio.Lock())
        async with lock:  # replicas on other nodes decide in turn, never all at once
            others_down = Replica.select().where(
                Replica.model == replica.model_id, Replica.id != replica.id,
                Replica.state.in_(("pending", "fetching", "starting", "restarting"))).exists()
            if others_down:
                return True  # wait until the one already restarting serves again
            _set(replica, "restarting", f"out of routing {why} once its requests are done")
        return True

    def _fail(self, replica, what, tail):
        failures = replica.failures + 1
        delay = retry_delay(failures)
        _set(replica, "failed", f"{what}; " + (f"retrying in {delay} s" if delay else "restarting now")
             + f"; last lines: {tail}",
             failures=failures)

    async def _tail(self, replica):
        lines, _ = await logs.read(self.t, replica.supervisor or self.supervisor, self.node.base_dir,
                                   replica.unit, 5)
        return " | ".join(line["text"] for line in lines[-3:]) or "(none)"

    async def start(self, replica):
        """Fetch the weights and launch the replica's engine under the node's supervisor."""
        model = replica.model
        install = EngineInstall.get_or_none(node=self.node, engine=model.engine)
        if install is None or install.state != "ready":
            _set(replica, "pending", f"waiting for {model.engine} to be ready on {self.node.name}")
            return
        if model.on_nodes:
            path = await weights.check_on_node(self.t, model, self.node.name)
        else:
            if not _set(replica, "fetching", f"copying {model.name}'s weights to {self.node.name}"):
                return  # moved or removed since this pass looked
            w = self.conf["weights"]
            path = await weights.ensure_on_node(self.t, self.node.base_dir, model,
                                                self.conf["engines"]["cache"], w["reserve_mb"],
                                                Progress(replica, self.node, _still_there).tell,
                                                w["max_rate_bytes"], self._node_tools())
        if not Replica.select().where(_still_there(replica)).exists():
            return  # removed or moved while its file was copied: the next pass starts it where it is
        await self.t.run(launch.stop_argv(self.supervisor, replica.unit, self.node.base_dir))
        await self._take_free_port(replica)
        await self._new_key(replica)
        serve = serve_of(self.node, replica, model, install, path)
        argv = launch.start_argv(self.supervisor, replica.unit, launch.engine_argv(serve),
                                 self.node.base_dir, launch.gpu_env(serve))
        await self.t.check(argv, what=f"starting {replica.unit}")
        cards = f" on GPU {', '.join(str(i) for i in replica.gpu_indexes)}" if replica.gpu_uuids else ""
        _set(replica, "starting", f"started as {replica.unit} under {self.supervisor}{cards}; "
                                  f"waiting for /health",
             supervisor=self.supervisor, endpoint=endpoint_of(self.node, replica.port),
             spec=spec_of(model, install, replica), progress=None)

    async def _new_key(self, replica):
        """Give the engine about to start a key of its own: stored (sealed) first, so whoever
        finds the engine running can reach it, then written to the node for the engine to read."""
        key = "sk-engine-" + secrets.token_urlsafe(32)
        root = self.conf["_root"]
        if not secrets_box.key_path(root).exists() and _anything_sealed():
            # Keys stored by a control plane whose key file this one lacks: a new file here
            # would open none of them, and the other gateways could not open what it seals.
            raise LlmgwError(f"there is no {secrets_box.key_path(root)}, but keys sealed with one "
                             f"are stored: {secrets_box.COPY_IT}")
        sealed = secrets_box.seal(root, key)
        if not Replica.update(engine_key=sealed).where(_still_there(replica)).execute():
            raise LlmgwError(f"{replica.name} was moved or removed while it was being started")
        replica.engine_key = sealed
        await self.t.check(launch.key_write_argv(self.node.base_dir, replica.unit), input=key,
                           what=f"writing {replica.unit}'s API key")

    def _node_tools(self):
        """The node's download tools when it fetches URL models itself, else None."""
        if not self.conf["weights"]["download_on_node"]:
            return None
        return (self.node.facts or {}).get("tools", [])

    async def _take_free_port(self, replica):
        """Move the replica to another port when something else on the node listens on its own."""
        listening = ports.parse_taken((await self.t.run(ports.LISTEN_ARGV)).stdout)
        if replica.port not in listening:
            return
        taken = {r.port for r in Replica.select().where(Replica.node == self.node)} | listening
        replica.port = free_port(taken, self.conf["reconciler"]["port_range"])
        Replica.update(port=replica.port).where(_still_there(replica)).execute()

    async def stop(self, replica):
        await self.t.run(launch.stop_argv(replica.supervisor or self.supervisor, replica.unit,
                                          self.node.base_dir))
