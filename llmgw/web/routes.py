"""Where each model can be served from: ready replicas and healthy external endpoints.

Read from the database every gateway.route_cache_seconds, never per request.
"""
import itertools
import logging

from flask import current_app

from .. import secrets_box
from ..db import cached
from ..models import Endpoint, Model, Node, Replica
from ..plans import routing
from ..plans.replica_state import ROUTED
from .upstream_http import Upstreams

log = logging.getLogger("llmgw.routes")


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
        self.opened = {}  # sealed key -> its Authorization header: decrypted once, not each read
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
        load, auth = {}, {}
        query = (Replica.select(Replica, Model, Node).join(Model).switch(Replica).join(Node))
        for r in query:
            entry = models.setdefault(r.model.name, _entry())
            url = r.endpoint + "/v1"
            if r.state in ROUTED and r.endpoint and self._sign(auth, url, r.engine_key, f"replica {r.name}"):
                entry["ready"].append(url)
                load[url] = r.load or 0
            elif r.state in ROUTED and r.endpoint:
                entry["not_ready"].append("a replica whose engine key this control plane cannot read")
            else:
                entry["not_ready"].append(f"a replica {r.state}")
        for ep in Endpoint.select():
            for name in ep.models or []:
                entry = models.setdefault(name, _entry())
                if ep.state == "ready" and self._sign(auth, ep.url, ep.api_key, f"endpoint {ep.name}"):
                    entry["ready"].append(ep.url)
                elif ep.state == "ready":
                    entry["not_ready"].append("an external endpoint whose key this control plane "
                                              "cannot read")
                else:
                    entry["not_ready"].append(f"an external endpoint {ep.state}")
        for entry in models.values():
            entry["ready"].sort()  # the same order in every worker, so sessions hash alike
        used = set(auth.values())  # keys of engines since restarted are forgotten
        self.opened = {k: v for k, v in self.opened.items() if v in used}
        return models, auth, load

    def _sign(self, auth, url, sealed, what):
        """Put the Authorization header for url into auth; return False when its sealed key
        cannot be read here (it is logged, and the endpoint is left out of routing)."""
        if not sealed:
            return True
        header = self.opened.get(sealed)
        if header is None:
            key = secrets_box.unseal_or_log(current_app.config["LLMGW"]["_root"], sealed, what, log)
            if key is None:  # no key file, another one, or a broken one
                return False
            header = self.opened[sealed] = "Bearer " + key
        auth[url] = header
        return True

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
