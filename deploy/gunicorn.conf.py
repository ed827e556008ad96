"""gunicorn settings for llmgw's web server: gevent workers, so streams do not hold a worker each."""
import sys as _sys

from llmgw import config as _config
from llmgw.errors import ConfigError as _ConfigError

try:
    _conf = _config.load()  # the same file (or LLMGW_ROOT) the app reads
except _ConfigError as _e:
    # One line naming the value and the fix, not gunicorn's traceback of this file.
    print(f"llmgw: {_e}", file=_sys.stderr)
    raise SystemExit(2) from None
# Every worker's metrics go to files in one directory (prometheus-client's multiprocess mode),
# emptied now, before any worker starts; /metrics adds them up.
from llmgw import metrics as _metrics  # noqa: E402
_metrics.start_process(_conf, "web")
bind = _conf["server"]["listen"]
workers = _conf["server"]["workers"]
# gevent's worker, answering what gunicorn's parser refuses in OpenAI's JSON error shape.
worker_class = "llmgw.gunicorn_worker.Worker"
worker_connections = 2000
# Recycle workers now and then, staggered so two never restart together (a recycled
# worker resets a few connections it had accepted but not yet started).
max_requests = 1000000
max_requests_jitter = 100000
# Long generations stream for minutes; gevent workers heartbeat independently of requests.
timeout = 120
# A stopping worker gives its requests gateway.shutdown_grace, then ends the rest with an error
# (an error event for streams) and bills them. A connection kept alive after its last answer is
# waited on for `keepalive` seconds more; gunicorn kills the worker (and its exit, which gives
# back its leases, never runs) only after all that.
keepalive = 5
graceful_timeout = _conf["gateway"]["shutdown_grace"] + keepalive + 5
# gunicorn 27 otherwise creates ~/.gunicorn/gunicorn.ctl.
control_socket_disable = True
# Off unless server.access_log names a file ("-": standard output). Every /v1 request is a
# usage row already (key, model, status, latency); a log line for it costs a twentieth of its CPU.
accesslog = _conf["server"]["access_log"] or None


def when_ready(server):
    """Ctrl-C stops gunicorn gracefully, as SIGTERM does (gunicorn's own SIGINT is a quick
    exit that does not wait for the workers' requests)."""
    server.handle_int = server.handle_term


def post_worker_init(worker):
    """Start the worker's settlement thread at once and for its whole life: it settles, gives
    back leased slices, beats, and recovers dead workers even while no request comes."""
    from llmgw.web.relay import start_resident, watch_shutdown
    start_resident(worker.wsgi)
    watch_shutdown(worker, _conf["gateway"]["shutdown_grace"])


def child_exit(server, worker):
    """A worker's gauges (requests in flight) leave the sum when it exits; its counters stay."""
    from prometheus_client import multiprocess
    multiprocess.mark_process_dead(worker.pid)
