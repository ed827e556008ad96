"""The reconciler: one asyncio process that converges every node on the wanted state.

It owns all long-running node work (discovery, installs, launches, health,
adoption) and answers the web's log requests, which arrive as rows. Only one
reconciler leads at a time; others wait for the lock.
"""
import asyncio
import datetime
import fcntl
import logging
import os
import signal
import time
from pathlib import Path

from . import db as dbmod
from .errors import LlmgwError
from .executors.release import ReleaseCache
from .models import LogRequest, Model, Node, Replica, database, utcnow
from .plans import placement
from .services import logs, nodes
from .services.install import Installer
from .services.replicas import NodeReplicas, running_units
from .plans.launch import supervisor_for

log = logging.getLogger("llmgw.reconciler")
REDISCOVER_SECONDS = 300
LOG_POLL_SECONDS = 0.25


class LeaderLock:
    """A file lock held for the reconciler's lifetime (SQLite: every reconciler shares the file)."""

    def __init__(self, path):
        self.path = Path(path)
        self.fd = None

    def try_acquire(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True


class Reconciler:
    def __init__(self, conf):
        self.conf = conf
        self.transports = {}
        self.running = {}
        self.discovered = {}
        e = conf["engines"]
        self.releases = ReleaseCache(e["cache"], e["github_api"], e["github_download"])

    def transport(self, node):
        t = self.transports.get(node.id)
        if t is None or getattr(t, "host_key", None) not in (None, node.host_key):
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

    async def pass_once(self):
        """One full pass: every node's facts and installs, placement, then every node's replicas."""
        all_nodes = list(Node.select())
        await asyncio.gather(*(self._node(n) for n in all_nodes), return_exceptions=True)
        self.place(list(Node.select()))
        await asyncio.gather(*(self._replicas(n) for n in Node.select()), return_exceptions=True)

    async def _node(self, node):
        t = self.transport(node)
        try:
            now = utcnow()
            last = self.discovered.get(node.id)
            if last is None or (now - last).total_seconds() > REDISCOVER_SECONDS:
                node.facts = await nodes.discover(t, node.base_dir)
                self.discovered[node.id] = now
            sup = supervisor_for(node.facts or {})
            self.running[node.id] = await running_units(t, sup, node.base_dir)
            node.reachable, node.last_seen, node.last_error = True, utcnow(), ""
            node.save()
        except LlmgwError as e:
            self.running.pop(node.id, None)
            stale = self.transports.pop(node.id, None)
            if stale is not None:
                await stale.close()
            node.reachable, node.last_error = False, str(e)
            node.save()
            return
        r = self.conf["reconciler"]
        installer = Installer(node, t, self.releases, r["verify_interval"], r["package_lock_retry"])
        for engine, version in self.wanted_engines().items():
            row = installer.row(engine, version)
            if row.state == "pending" or row.version != version or row.next_check <= utcnow():
                await installer.converge(engine, version)

    def place(self, all_nodes):
        """Record where each model's replicas go; adopt running units; drop surplus replicas."""
        facts = [{"name": n.name, "reachable": n.reachable,
                  "installs": {i.engine: (i.state, i.detail) for i in n.installs}} for n in all_nodes]
        by_name = {n.name: n for n in all_nodes}
        running = {n.name: self.running.get(n.id, set()) for n in all_nodes}
        for model in Model.select():
            names = placement.replica_names(model.name, model.replicas)
            rows = {r.name: r for r in model.replica_rows}
            existing = {name: r.node.name for name, r in rows.items()}
            cands = placement.candidates(facts, model.engine)
            placed, refusal = placement.assign(names, existing, running, cands)
            for name, node_name in placed.items():
                if name not in rows:
                    node = by_name[node_name]
                    used = {r.port for r in Replica.select().where(Replica.node == node)}
                    port = placement.free_port(used, self.conf["reconciler"]["port_range"])
                    Replica.create(name=name, model=model, node=node, port=port,
                                   detail=f"placed on {node_name}")
            if refusal:
                log.warning("model %s: %s", model.name, refusal)
            for name, row in rows.items():
                if name not in names:
                    row.delete_instance()

    async def _replicas(self, node):
        if node.id not in self.running:
            return
        await NodeReplicas(node, self.transport(node), self.conf).converge(self.running[node.id])

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
        try:
            while not stop.is_set():
                try:
                    await self.pass_once()
                except Exception:  # one bad pass must not end the process
                    log.exception("reconcile pass failed")
                try:
                    await asyncio.wait_for(stop.wait(), interval)
                except asyncio.TimeoutError:
                    pass
        finally:
            logs_task.cancel()
            for t in self.transports.values():
                await t.close()

    async def _log_loop(self, stop):
        while not stop.is_set():
            try:
                await self.answer_log_requests()
            except Exception:
                log.exception("answering log requests failed")
            await asyncio.sleep(LOG_POLL_SECONDS)


def _seconds(n):
    return datetime.timedelta(seconds=n)


def main(conf, once=False):
    """Entry point of `flask llmgw reconcile`: take the lead, then reconcile until stopped."""
    dbmod.bind(conf["database"]["url"])
    lock = LeaderLock(Path(conf["_root"]) / "reconciler.lock")
    while not lock.try_acquire():
        log.info("another reconciler leads; standing by")
        time.sleep(5)
    database.connect(reuse_if_open=True)
    rec = Reconciler(conf)

    async def go():
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if once:
            await rec.pass_once()
            await rec.pass_once()
            return
        await rec.run(stop)

    asyncio.run(go())
