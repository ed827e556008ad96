"""Where each model can be served from: ready replicas and healthy external endpoints.

Read from the database every gateway.route_cache_seconds, never per request.
"""
import itertools

from flask import current_app

from .. import secrets_box
from ..db import cached
from ..models import Endpoint, Model, Node, Replica
from ..plans import routing
from ..plans.replica_state import ROUTED
from .upstream_http import Upstreams


def _unplaced(model):
    """Whether placement found no place for some of a model's replicas."""
    verdict = model.verdict or {}
    return bool(verdict) and verdict.get("placed", 0) < verdict.get("wanted", 0)


def _entry():
    # "not_ready": why this model has no ready copy, in words an API client may read: states
    # only, never a node's or endpoint's name or an engine's log lines (the pages show those).
    return {"ready": [], "not_ready": [], "fallbacks": []}


class Routes:
    def __init__(self):
        self.read = {}  # "routes" -> ((models, auth, load), when read): see db.cached
        self.reading = {}
        self.models = {}
        self.auth = {}
        self.load = {}
        self.inflight = {}
        self.turn = itertools.count()
        # One pool of kept-alive connections to the engines per worker, not a TCP handshake per request.
        self.http = Upstreams()

    def refresh(self, max_age):
        """Read the routes again if they were read more than max_age seconds ago."""
        self.models, self.auth, self.load = cached(self.read, self.reading, "routes", max_age, self._load)

    def _load(self):
        models = {}
        for m in Model.select():
            entry = models[m.name] = _entry()
            entry["fallbacks"] = m.fallbacks or []
            if _unplaced(m):
                entry["not_ready"].append("placement found no node that can run it")
        load = {}
        query = (Replica.select(Replica, Model, Node).join(Model).switch(Replica).join(Node))
        for r in query:
            entry = models.setdefault(r.model.name, _entry())
            if r.state in ROUTED and r.endpoint:
                entry["ready"].append(r.endpoint + "/v1")
                load[r.endpoint + "/v1"] = r.load or 0
            else:
                entry["not_ready"].append(f"a replica {r.state}")
        auth = {}
        for ep in Endpoint.select():
            for name in ep.models or []:
                entry = models.setdefault(name, _entry())
                if ep.state == "ready":
                    entry["ready"].append(ep.url)
                    if ep.api_key:
                        auth[ep.url] = "Bearer " + secrets_box.unseal(
                            current_app.config["LLMGW"]["_root"], ep.api_key)
                else:
                    entry["not_ready"].append(f"an external endpoint {ep.state}")
        for entry in models.values():
            entry["ready"].sort()  # the same order in every worker, so sessions hash alike
        return models, auth, load

    def serve_with(self, model, allowed, session=""):
        """Return (the model that will serve, its endpoints): this one, else its first fallback
        with a ready replica that the key may use."""
        for name in [model] + list(self.models[model].get("fallbacks", [])):
            if name in self.models and allowed(name):
                endpoints = self.pick(name, session)
                if endpoints:
                    return name, endpoints
        return model, []

    def pick(self, model, session=""):
        """Return ready base URLs (…/v1) in the order to try them."""
        busy = {e: self.inflight.get(e, 0) + self.load.get(e, 0) for e in self.models[model]["ready"]}
        return routing.order(list(self.models[model]["ready"]), busy, next(self.turn), session)
