"""GET /metrics: llmgw's own metrics in Prometheus' text format, for a scraper holding
metrics.token (sent as `Authorization: Bearer TOKEN`)."""
import hmac
import os
from pathlib import Path

from flask import Blueprint, Response, current_app, request

from .. import metrics

bp = Blueprint("metrics", __name__)


def _refuse(status, text, **headers):
    return Response(text + "\n", status=status, mimetype="text/plain", headers=headers)


@bp.get("/metrics")
def scrape():
    conf = current_app.config["LLMGW"]
    token = conf["metrics"]["token"]
    if not token:
        return _refuse(404, f"metrics are off: set metrics.token in {conf['_path']} to a secret "
                            "and give it to the scraper as its bearer token")
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
        return _refuse(401, "send metrics.token as `Authorization: Bearer TOKEN` "
                            "(Prometheus: authorization.credentials in the scrape config)",
                       **{"WWW-Authenticate": "Bearer"})
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    from ..services.cluster_metrics import ClusterCollector
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get(metrics.ENV):
        MultiProcessCollector(registry)  # every gunicorn worker's values, added up
    else:
        registry.register(_Own(REGISTRY))  # one process (a test's app): its values in memory
    reconciler = metrics.directory(conf, "reconciler")
    if Path(reconciler).is_dir() and str(reconciler) != os.environ.get(metrics.ENV):
        MultiProcessCollector(registry, path=str(reconciler))
    registry.register(current_app.extensions.setdefault("llmgw.cluster_metrics", ClusterCollector()))
    return Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)


class _Own:
    """This process's registry, collected into the scrape's."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()
