"""llmgw's own Prometheus metrics, written by prometheus-client.

Gunicorn runs several worker processes, so the gateway's counters use prometheus-client's
multiprocess mode: each process writes its values to files in one directory
(PROMETHEUS_MULTIPROC_DIR, set before prometheus_client is first imported) and whoever answers
/metrics adds them up. The web server's directory is emptied when gunicorn starts; the
reconciler, a process of its own, writes to a directory of its own, emptied when it starts.
A process without that variable (a test's app, a command) keeps its values in memory.

What describes the cluster (nodes, GPUs, replicas, installs) is read from the database when
/metrics is scraped (web/metrics.py), so every control plane reports the same numbers.
"""
import os
import shutil
import threading
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"

# Seconds: a cached-token answer to a slow generation.
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
FIRST_TOKEN_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
PASS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120)


def directory(conf, process):
    """Where `process` ("web" or "reconciler") writes its values."""
    base = conf["metrics"]["dir"] or str(Path(conf["_root"]) / "metrics")
    return Path(base) / process


def start_process(conf, process):
    """In a process about to start (gunicorn's master, the reconciler): empty its directory and
    point prometheus-client at it. Must run before prometheus_client is imported."""
    path = directory(conf, process)
    if os.environ.get(ENV) != str(path):
        # Not on a reload (gunicorn reads its config again on SIGHUP, in the same master):
        # the workers still running keep their files.
        shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True, mode=0o700, exist_ok=True)
    os.environ[ENV] = str(path)
    return path


class _Family:
    """One metric, created at first use (prometheus_client is imported only then), with its
    labelled children cached: .labels() costs more than the increment itself."""

    def __init__(self, kind, name, doc, labels, **kw):
        self.kind, self.name, self.doc, self.labelnames, self.kw = kind, name, doc, labels, kw
        self.metric = None
        self.children = {}
        self.lock = threading.Lock()

    def __call__(self, *values):
        child = self.children.get(values)
        if child is None:
            with self.lock:
                if self.metric is None:
                    import prometheus_client
                    self.metric = getattr(prometheus_client, self.kind)(
                        self.name, self.doc, self.labelnames, **self.kw)
                child = self.children[values] = self.metric.labels(*values) if values else self.metric
        return child


# The gateway (web workers), counted when a request is settled, off the request's path.
REQUESTS = _Family("Counter", "llmgw_requests", "Requests answered by the gateway, by the model "
                   "that served them, project and HTTP status.", ("model", "project", "status"))
LATENCY = _Family("Histogram", "llmgw_request_duration_seconds", "Seconds from admission to the "
                  "last byte relayed.", ("model",), buckets=LATENCY_BUCKETS)
FIRST_TOKEN = _Family("Histogram", "llmgw_time_to_first_token_seconds", "Seconds from admission "
                      "to a stream's first bytes from the engine (streamed requests only).",
                      ("model",), buckets=FIRST_TOKEN_BUCKETS)
TOKENS = _Family("Counter", "llmgw_tokens", "Tokens billed, by model, project and kind (prompt "
                 "or completion).", ("model", "project", "kind"))
SPEND = _Family("Counter", "llmgw_spend", "Money billed, in the prices' currency.", ("model", "project"))
REFUSED = _Family("Counter", "llmgw_rate_limited", "Requests refused with a 429, by the scope "
                  "whose limit ran out and OpenAI's error type.", ("scope", "type"))
IN_FLIGHT = _Family("Gauge", "llmgw_requests_in_flight", "Requests the gateway is relaying now "
                    "(each worker's count, at most a second old).", (), multiprocess_mode="livesum")

# The reconciler.
PASS = _Family("Histogram", "llmgw_reconciler_pass_duration_seconds", "Seconds one reconciler "
               "pass over the cluster took.", (), buckets=PASS_BUCKETS)
SSH_COMMANDS = _Family("Counter", "llmgw_ssh_commands", "Commands run on a node, by outcome: "
                       "ok, nonzero (it ran and exited non-zero, which some checks expect) or "
                       "error (no connection, a timeout, a broken session).", ("node", "outcome"))


def settled(model, project, status, prompt, completion, cost_micros, seconds, first_token):
    """Count one finished request."""
    REQUESTS(model, project, str(status)).inc()
    LATENCY(model).observe(seconds)
    if first_token is not None:
        FIRST_TOKEN(model).observe(first_token)
    if prompt:
        TOKENS(model, project, "prompt").inc(prompt)
    if completion:
        TOKENS(model, project, "completion").inc(completion)
    if cost_micros:
        SPEND(model, project).inc(cost_micros / 1_000_000)


def refused(scope, kind):
    REFUSED(scope, kind).inc()


def in_flight(n):
    IN_FLIGHT().set(n)
