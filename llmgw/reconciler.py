"""The reconciler: one asyncio process that converges every node on the wanted state.

It owns all long-running node work (discovery, installs, launches, health,
adoption) and answers the web's log requests, which arrive as rows. Only one
reconciler leads at a time; others wait for the lock.
"""
import asyncio
import concurrent.futures
import datetime
import logging
import os
import signal
import time

from . import db as dbmod
from . import metrics
from . import leader
from .errors import HostKeyMismatch, LlmgwError
from .executors.release import ReleaseCache
from .models import EngineInstall, LogRequest, Model, Node, Replica, database, utcnow
from .services import catalog, collect, command_log, endpoints, lifecycle, logs, nodes, placing
from .services.install import Installer, converge_probed
from .services.replicas import NodeReplicas, check_over_http, units_on
from .plans.launch import supervisor_for

log = logging.getLogger("llmgw.reconciler")
REDISCOVER_SECONDS = 300
LOG_POLL_SECONDS = 0.25
STANDBY_POLL_SECONDS = 2
LEAD_CHECK_SECONDS = 2
LEAD_CHECK_TIMEOUT = 15
# How long a pass waits for the nodes' looks before it places replicas: an answering node
# answers within it; one that does not is tended from its last finished look.
LOOK_PATIENCE_SECONDS = 3
# How often a node's unused weights are looked for (more often when keep_unused is shorter).
COLLECT_SECONDS = 300


class Reconciler:
    def __init__(self, conf):
        self.conf = conf
        self.transports = {}
        self.reachable = set()  # nodes SSH reached this pass
        self.impostors = set()  # nodes whose address answered with another host key
        self.tasks = {}
        self.gpus_checked = {}  # node id -> when nvidia-smi was last asked
        self.collected = {}  # node id -> when its unused weights were last looked for
        self.lost = lifecycle.LostWatch(conf["reconciler"]["node_lost_after"])
        command_log.recording = True  # the node page shows what this process runs on nodes
        e = conf["engines"]
        self.releases = ReleaseCache(e["cache"], e["github_api"], e["github_download"])

    def transport(self, node):
        t = self.transports.get(node.id)
        if t is None or _reach(t) != _reach_of(node):
            if t is not None:
                self._spawn(("close", node.id, id(t)), t.close())
            t = self.transports[node.id] = nodes.transport_for(node, self.conf)
        return t

    def wanted_engines(self):
        """Return {engine: version} every node should have."""
        wanted = {}
        if self.conf["engines"]["llamacpp"]:
            wanted["llamacpp"] = self.conf["engines"]["llamacpp"]
        if Model.select().where(Model.engine == "sim").exists():
            wanted["sim"] = "builtin"
        return wanted

    def _spawn(self, key, coro):
        """Run coro as the one background task for key, unless that task is still running."""
        task = self.tasks.get(key)
        if task is not None and not task.done():
            coro.close()
            return
        task = asyncio.create_task(coro, name=str(key))
        task.add_done_callback(_log_failure)
        self.tasks[key] = task

    async def drain(self):
        """Wait for every background task (installs, starts) to finish."""
        while pending := [t for t in self.tasks.values() if not t.done()]:
            await asyncio.gather(*pending, return_exceptions=True)

    async def pass_once(self):
        """One pass: look at every node, place replicas, hand slow work to per-node tasks.

        Each node is looked at by a task of its own. A node that does not answer (packets
        dropped: SSH waits out its connect timeout) keeps only its own look waiting; the pass
        waits a moment for the looks, then places and tends every node from what its last
        finished look said. One silent node once held every node's pass (and last-seen) for a
        minute. Installs and replica starts run as background tasks, one of each per node, so
        an apt lock on one node or a model file copied to another holds up nobody else.
        """
        nodes_now = list(Node.select())
        for node in nodes_now:
            self._spawn(("look", node.id), self._look_bounded(node))
        looks = [self.tasks[("look", n.id)] for n in nodes_now]
        if looks:
            await asyncio.wait(looks, timeout=LOOK_PATIENCE_SECONDS)
        self._spawn(("endpoints",), endpoints.check_all(self.conf["_root"]))
        for node in nodes_now:
            self.lost.watch(node, node.id in self.reachable, node.id in self.impostors)
        try:
            self.place()
        except Exception:  # a placement bug must not stop installs, health checks and starts
            log.exception("placing replicas failed this pass")
        for node in Node.select():
            if node.state == "draining":
                lifecycle.drained(node)
            if node.id in self.reachable:  # its installs were started by its look
                self._spawn(("replicas", node.id), self._replicas(node.id))
            elif node.id in self.impostors:
                lifecycle.distrust(node)
            else:
                self._spawn(("http-health", node.id), self._http_health(node))
        try:
            command_log.flush()
        except Exception as e:  # the next pass writes them; nothing depends on it
            log.warning("writing the node command log failed: %s", e)

    async def _http_health(self, node):
        if await check_over_http(list(node.replicas), self.conf):
            self.lost.answered(node.id)

    async def _look_bounded(self, node):
        """Look at one node within a bound: a node busy with long copies waits for the next pass."""
        try:
            await asyncio.wait_for(self._look(node), self.conf["ssh"]["connect_timeout"] + 50)
        except asyncio.TimeoutError:
            log.warning("%s: looking at it took too long this pass", node.name)
        except Exception:  # one node's surprise is logged, never the whole pass's end
            log.exception("looking at %s failed", node.name)
            return
        if node.id in self.reachable:
            # Installs need no placement, so every look that reaches its node starts them: one
            # whose look outlasted the pass's patience (its first address dead, say) too.
            self._spawn(("install", node.id), self._installs(node.id))
            keep = self.conf["weights"]["keep_unused_seconds"]
            every = min(COLLECT_SECONDS, max(1, keep))
            if keep and time.monotonic() - self.collected.get(node.id, 0) >= every:
                self.collected[node.id] = time.monotonic()
                self._spawn(("weights", node.id), self._collect(node.id, keep))

    async def _collect(self, node_id, keep):
        """Delete the weights no replica on the node has used for weights.keep_unused."""
        node = Node.get_or_none(Node.id == node_id)
        if node is None:
            return
        t = self.transport(node)
        try:
            await collect.collect(node, t, await collect.look(node, t, keep), keep)
        except LlmgwError as e:
            log.warning("%s: collecting weights: %s", node.name, e)

    async def _look(self, node):
        """Reach the node (discovering it when due); a failure marks it unreachable.

        What runs there is listed by its replicas task, when that task runs, not here.
        """
        try:
            t = self.transport(node)
            if node.discovered is None or (utcnow() - node.discovered).total_seconds() > REDISCOVER_SECONDS:
                await nodes.rediscover(node, t)
                self.gpus_checked[node.id] = time.monotonic()
            elif (node.facts or {}).get("gpus") and self._gpu_check_due(node.id):
                # A card that turns sick must lose its replicas within a minute, not five.
                await nodes.check_gpus(node, t)
            else:
                await t.check(["true"], what="reaching the node")
            self.reachable.add(node.id)
            self.impostors.discard(node.id)
            node.reachable, node.last_seen, node.last_error = True, utcnow(), ""
        except LlmgwError as e:
            self.reachable.discard(node.id)
            if isinstance(e, HostKeyMismatch):
                self.impostors.add(node.id)
            else:
                self.impostors.discard(node.id)
            stale = self.transports.pop(node.id, None)
            if stale is not None:
                await stale.close()
            node.reachable, node.last_error = False, str(e)
        node.save(only=[Node.reachable, Node.last_seen, Node.last_error])

    def _gpu_check_due(self, node_id):
        now = time.monotonic()
        if now - self.gpus_checked.get(node_id, 0) < self.conf["reconciler"]["gpu_check_interval"]:
            return False
        self.gpus_checked[node_id] = now
        return True

    async def _installs(self, node_id):
        node = Node.get_or_none(Node.id == node_id)
        if node is None:
            return
        r = self.conf["reconciler"]
        installer = Installer(node, self.transport(node), self.releases, r["verify_interval"],
                              r["package_lock_retry"], self.conf["engines"]["download_on_node"])
        for engine, version in self.wanted_engines().items():
            row = installer.row(engine, version)
            # This task is the only one installing on this node, so a row it finds
            # "installing" was left by a reconciler that died mid-install: resume it now.
            if row.state in ("pending", "installing") or row.version != version \
                    or row.next_check <= utcnow():
                await installer.converge(engine, version)
        for engine, path in self.conf["node_engines"].get(node.name, {}).items():
            row = EngineInstall.get_or_none(node=node, engine=engine)
            if row is None or row.binary != path or row.next_check <= utcnow():
                await converge_probed(node, installer.t, engine, path, r["verify_interval"])

    def place(self):
        """Record where each model's replicas go (node and cards) and drop surplus replicas."""
        snap = placing.snapshot()
        nodes, models, replicas, _ = snap
        result = placing.plan(*snap)
        placing.Applier(nodes, models, replicas, self.conf["reconciler"]["port_range"]).apply(result)

    async def _replicas(self, node_id):
        """Look at the node's engines now, then give each replica a task of its own.

        One replica whose model takes an hour to copy must not hold up the health of the rest.
        """
        node = Node.get_or_none(Node.id == node_id)
        if node is None or node_id not in self.reachable:
            return
        work = NodeReplicas(node, self.transport(node), self.conf)
        try:
            if node.lost_since is not None:
                # Back after being lost: nothing of what it runs is wanted any more.
                await work.back(await units_on(work.t, work.supervisor, node.base_dir))
                return
            running, rows = await work.look()
        except LlmgwError as e:
            log.warning("%s: %s", node.name, e)
            return
        for row in rows:
            self._spawn(("replica", row.id), work.one(row, row.name in running))

    async def answer_log_requests(self):
        """Answer pending log-pane requests (the web never runs SSH itself)."""
        pending = list(LogRequest.select().where(LogRequest.state == "pending").limit(20))
        await asyncio.gather(*(self._answer(r) for r in pending), return_exceptions=True)
        LogRequest.delete().where(LogRequest.created < utcnow() - _seconds(300)).execute()

    async def _answer(self, req):
        node = req.node
        replica = Replica.get_or_none(Replica.name == req.source, Replica.node == node)
        try:
            if replica is None:
                raise LlmgwError(f"{node.name} runs no replica called {req.source!r}")
            sup = replica.supervisor or supervisor_for(node.facts or {})
            lines, cursor = await logs.read(self.transport(node), sup, node.base_dir, replica.unit,
                                            req.lines, req.cursor)
            req.result, req.next_cursor, req.state = lines, cursor, "done"
        except LlmgwError as e:
            req.result, req.next_cursor, req.state = [{"ts": "", "text": str(e), "unit": ""}], req.cursor, "failed"
        req.save()

    async def run(self, stop=None):
        """Run passes and the log answerer until stop is set."""
        stop = stop or asyncio.Event()
        interval = self.conf["reconciler"]["interval"]
        logs_task = asyncio.create_task(self._log_loop(stop))
        stopped = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                # A pass is cut short when told to stop: a reconciler that lost the lead must
                # not go on placing replicas while its successor does.
                this_pass = asyncio.create_task(self.pass_once())
                began = time.monotonic()
                await asyncio.wait({this_pass, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not this_pass.done():
                    this_pass.cancel()
                else:
                    metrics.PASS().observe(time.monotonic() - began)
                await asyncio.gather(this_pass, return_exceptions=True)
                if not this_pass.cancelled() and this_pass.exception() is not None:
                    # one bad pass must not end the process
                    log.error("reconcile pass failed", exc_info=this_pass.exception())
                try:
                    await asyncio.wait_for(asyncio.shield(stopped), interval)
                except asyncio.TimeoutError:
                    pass
        finally:
            stopped.cancel()
            logs_task.cancel()
            for key, task in self.tasks.items():
                if key[0] != "close":  # closing a replaced SSH connection is let finish
                    task.cancel()
            await asyncio.wait([logs_task, *self.tasks.values()], timeout=10)
            await self.close()

    async def close(self):
        for t in self.transports.values():
            await t.close()
        self.transports.clear()

    async def _log_loop(self, stop):
        while not stop.is_set():
            try:
                await self.answer_log_requests()
            except Exception:
                log.exception("answering log requests failed")
            await asyncio.sleep(LOG_POLL_SECONDS)


def _reach(t):
    return (getattr(t, "addrs", None), getattr(t, "user", None), getattr(t, "host_key", None),
            getattr(t, "sudo", None))


def _reach_of(node):
    if node.transport == "local":
        return (None, None, None, None)
    return (nodes.addrs_of(node), node.ssh_user, node.host_key, node.use_sudo)


def _log_failure(task):
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed", task.get_name(), exc_info=task.exception())


def _seconds(n):
    return datetime.timedelta(seconds=n)


def main(conf, once=False):
    """Entry point of `flask llmgw reconcile`: take the lead, reconcile until stopped; if the
    lead is lost (the database connection that holds it broke), stop all node work and stand
    by until it can be taken again."""
    dbmod.bind(conf["database"]["url"])
    lock = leader.lock_for(conf)
    while True:
        said = False
        while not lock.try_acquire():
            if not said:
                log.info("another reconciler leads (%s); standing by", lock.describe())
                said = True
            time.sleep(STANDBY_POLL_SECONDS)
        log.info("leading: pid %d holds %s", os.getpid(), lock.describe())
        database.connect(reuse_if_open=True)
        try:
            for line in catalog.sync_declared(conf):
                log.info("declared models: %s", line)
        except Exception:  # the catalog stays as it was; the reconciler still runs
            log.exception("taking the declared models from %s failed", conf["_path"])
        lost = asyncio.run(_lead(Reconciler(conf), lock, once))
        if not database.is_closed():
            database.close()
        if not lost:
            lock.release()
            return
        log.warning("lost the lead; node work stopped, standing by")


async def _lead(rec, lock, once):
    """Reconcile while this process holds the lead; return True when the lead was lost."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if once:
        for _ in range(2):
            await rec.pass_once()
            await rec.drain()
        await rec.close()
        return False
    lost = False
    checks = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lead-check")

    async def watch():
        nonlocal lost
        while not stop.is_set():
            await asyncio.sleep(LEAD_CHECK_SECONDS)
            try:
                held = await asyncio.wait_for(loop.run_in_executor(checks, lock.holds),
                                              LEAD_CHECK_TIMEOUT)
            except asyncio.TimeoutError:
                log.warning("the database did not say within %d s whether this reconciler still "
                            "leads; assuming not", LEAD_CHECK_TIMEOUT)
                lock.abandon()
                held = False
            if not held:
                lost = True
                stop.set()

    watcher = asyncio.create_task(watch())
    try:
        await rec.run(stop)
    finally:
        watcher.cancel()
        # A check stuck on a dead connection must not keep this process from standing by:
        # asyncio.run waits for its default executor's threads, not for this one's.
        checks.shutdown(wait=False)
    return lost
