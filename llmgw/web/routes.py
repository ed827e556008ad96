"""Where each model can be served from: ready replicas and healthy external endpoints.

Read from the database every gateway.route_cache_seconds, never per request.
"""
import itertools
import threading
import time

from flask import current_app

from .. import secrets_box
from ..models import Endpoint, Model, Node, Replica


class Routes:
    def __init__(self):
        self.lock = threading.Lock()
        self.loaded = 0.0
        self.models = {}
        self.auth = {}
        self.inflight = {}
        self.turn = itertools.count()

    def refresh(self, max_age):
        if time.monotonic() - self.loaded < max_age:
            return
        with self.lock:
            models = {m.name: {"ready": [], "why": []} for m in Model.select()}
            query = (Replica.select(Replica, Model, Node).join(Model).switch(Replica).join(Node))
            for r in query:
                entry = models.setdefault(r.model.name, {"ready": [], "why": []})
                if r.state == "ready" and r.endpoint:
                    entry["ready"].append(r.endpoint + "/v1")
                else:
                    entry["why"].append(f"{r.name} on {r.node.name}: {r.state}"
                                        + (f" ({r.detail})" if r.detail else ""))
            auth = {}
            for ep in Endpoint.select():
                for name in ep.models or []:
                    entry = models.setdefault(name, {"ready": [], "why": []})
                    if ep.state == "ready":
                        entry["ready"].append(ep.url)
                        if ep.api_key:
                            auth[ep.url] = "Bearer " + secrets_box.unseal(
                                current_app.config["LLMGW"]["_root"], ep.api_key)
                    else:
                        entry["why"].append(f"endpoint {ep.name}: {ep.state} ({ep.detail})")
            self.models, self.auth, self.loaded = models, auth, time.monotonic()

    def pick(self, model):
        """Return ready base URLs (…/v1), least outstanding first (ties rotate)."""
        endpoints = list(self.models[model]["ready"])
        turn = next(self.turn)
        return sorted(endpoints, key=lambda e: (self.inflight.get(e, 0),
                                                (endpoints.index(e) - turn) % max(len(endpoints), 1)))
