"""The cluster as the database describes it, as Prometheus metric families: read when /metrics
is scraped, so every control plane (and every gunicorn worker) reports the same numbers."""
import collections
import threading
import time

from ..models import EngineInstall, Model, Node, Replica
from .overview import node_state

# Several scrapers (two Prometheus servers, a dashboard) within this many seconds share one read.
CACHE_SECONDS = 5
REPLICA_STATES = ("pending", "fetching", "starting", "ready", "unhealthy", "failed", "moving",
                  "restarting", "draining", "stopping", "lost")
NODE_STATES = ("ready", "cordoned", "draining", "drained", "lost", "unreachable")


def read():
    """Return the database's facts the families are made of (plain values)."""
    nodes = [(n.name, node_state(n), n.reachable, (n.facts or {}).get("gpus") or [])
             for n in Node.select(Node.name, Node.state, Node.lost_since, Node.reachable, Node.facts)]
    replicas = collections.Counter(
        (r.model.name, r.state) for r in Replica.select(Replica.state, Model.name).join(Model))
    wanted = {m.name: m.replicas for m in Model.select(Model.name, Model.replicas)}
    installs = collections.Counter((i.engine, i.state)
                                   for i in EngineInstall.select(EngineInstall.engine, EngineInstall.state))
    return nodes, replicas, wanted, installs


def families(nodes, replicas, wanted, installs):
    """Return the metric families of what read() returned."""
    from prometheus_client.core import GaugeMetricFamily
    by_state = GaugeMetricFamily("llmgw_nodes", "Nodes by state.", labels=["state"])
    states = collections.Counter(state for _, state, _, _ in nodes)
    for state in sorted(set(NODE_STATES) | set(states)):
        by_state.add_metric([state], states.get(state, 0))
    reachable = GaugeMetricFamily("llmgw_node_reachable", "1 when the node's last look over SSH "
                                  "succeeded, else 0.", labels=["node"])
    gpu_total = GaugeMetricFamily("llmgw_gpu_memory_bytes", "A GPU's memory, as last discovered.",
                                  labels=["node", "gpu", "class"])
    gpu_used = GaugeMetricFamily("llmgw_gpu_memory_used_bytes", "A GPU's memory in use, as last "
                                 "discovered.", labels=["node", "gpu", "class"])
    gpu_ok = GaugeMetricFamily("llmgw_gpu_healthy", "1 when a GPU answered its last health check, "
                               "else 0.", labels=["node", "gpu", "class"])
    for name, _, up, gpus in nodes:
        reachable.add_metric([name], 1 if up else 0)
        for g in gpus:
            labels = [name, str(g.get("index") if g.get("index") is not None else g.get("bus_id", "?")),
                      str(g.get("class") or "")]
            gpu_total.add_metric(labels, (g.get("memory_mib") or 0) * 2**20)
            gpu_used.add_metric(labels, (g.get("memory_used_mib") or 0) * 2**20)
            gpu_ok.add_metric(labels, 1 if g.get("healthy") else 0)
    reps = GaugeMetricFamily("llmgw_replicas", "Replicas by model and state.", labels=["model", "state"])
    for model in sorted(wanted):
        for state in REPLICA_STATES:
            reps.add_metric([model, state], replicas.get((model, state), 0))
    for (model, state), n in sorted(replicas.items()):
        if model not in wanted or state not in REPLICA_STATES:
            reps.add_metric([model, state], n)
    want = GaugeMetricFamily("llmgw_replicas_wanted", "Replicas a model asks for.", labels=["model"])
    for model, n in sorted(wanted.items()):
        want.add_metric([model], n)
    inst = GaugeMetricFamily("llmgw_engine_installs", "Engine installs on nodes, by engine and state.",
                             labels=["engine", "state"])
    for (engine, state), n in sorted(installs.items()):
        inst.add_metric([engine, state], n)
    return [by_state, reachable, gpu_total, gpu_used, gpu_ok, reps, want, inst]


class ClusterCollector:
    """A prometheus_client collector of families(read()), read at most every CACHE_SECONDS
    (one per app: a process serves one database)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cached = (0.0, None)

    def collect(self):
        with self.lock:
            at, got = self.cached
            if got is None or time.monotonic() - at > CACHE_SECONDS:
                got = read()
                self.cached = (time.monotonic(), got)
        return families(*got)
