"""The OpenAI-compatible gateway: /v1/models, chat, completions, embeddings.

The request path touches the database at most through two small in-memory
caches (keys and routes) refreshed every few seconds, and never SSH: engines
are reached over HTTP at the endpoints the reconciler recorded.
"""
import collections
import functools
import logging

from flask import Blueprint, current_app, jsonify, render_template, request
from werkzeug.exceptions import HTTPException

from .. import metrics
from ..db import DatabaseAway
from ..plans import request_check
from ..services import quota, tenancy
from . import relay as relay_mod
from .openai_errors import error
from .routes import Routes

bp = Blueprint("gateway", __name__, url_prefix="/v1")
ENGINE_PATHS = {"chat/completions", "completions", "embeddings"}
KEY_CACHE_SECONDS = 5
log = logging.getLogger("llmgw.gateway")
FRESH_BEFORE_503_SECONDS = 0.25


def json_errors(app):
    """Answer errors under /v1/ in OpenAI's shape, never as an HTML page."""
    @app.errorhandler(HTTPException)
    def _http(e):
        if not request.path.startswith("/v1/"):
            if e.code is None or e.code < 400 or request.path in ("/metrics", "/health"):
                return e
            # A page with the site's navigation and what to do, not a bare "Forbidden".
            return render_template("error.html", e=e), e.code
        kind = "invalid_request_error" if e.code < 500 else "server_error"
        return error(e.code, f"{e.name}: {e.description}", kind)

    @app.errorhandler(DatabaseAway)
    def _database_away(e):
        # What the workers know (keys, routes, limits' leased slices) keeps serving; what
        # needs the database fails closed.
        # The driver's words (they may name the database's host) go to the log, not the client.
        log.warning("a request needed the database, which does not answer: %s", e)
        if not request.path.startswith("/v1/"):
            return "The database cannot be reached; try again shortly.", 503
        return error(503, "The gateway cannot reach its database, and this request needs it (a "
                          "key or a limit it has not seen lately); try again shortly.",
                     "server_error", "database_unavailable", headers={"Retry-After": "5"})

    @app.errorhandler(Exception)
    def _unexpected(e):
        if isinstance(e, HTTPException):
            return _http(e)
        current_app.logger.exception("unhandled error on %s", request.path)
        if request.path.startswith("/v1/"):
            return error(500, "The gateway failed unexpectedly; the server log has the details.",
                         "server_error")
        return "Internal server error; the server log has the details.", 500


def caches():
    """Return this app's (routes, keys, quota lookups), one set per app: per worker, per test."""
    got = current_app.extensions.get("llmgw.gateway")
    if got is None:
        got = current_app.extensions["llmgw.gateway"] = (
            Routes(), quota.Lookups(ttl=KEY_CACHE_SECONDS), quota.Lookups())
    return got


def authenticate():
    """Return the API key row for the request's bearer token, or None."""
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    token = token.strip()
    return caches()[1].get(("key", token), lambda: tenancy.lookup_key(token))


@bp.before_request
def _auth():
    key = authenticate()
    if key is None:
        return error(401, "Missing or invalid API key. Send 'Authorization: Bearer <key>' with a key "
                          "from `flask llmgw keys create`.", "invalid_request_error", "invalid_api_key")
    request.llmgw_key = key
    caches()[0].refresh(current_app.config["LLMGW"]["gateway"]["route_cache_seconds"])
    return None


@bp.get("/models")
def list_models():
    routes = caches()[0]
    data = [{"id": name, "object": "model", "created": 0, "owned_by": "llmgw"}
            for name in sorted(routes.models) if quota.allowed(request.llmgw_key, name)]
    return jsonify({"object": "list", "data": data})


@bp.post("/<path:path>")
def relay(path):
    if path not in ENGINE_PATHS:
        return error(404, f"/v1/{path} is not an endpoint of this gateway.", "invalid_request_error",
                     "unknown_url")
    body = request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        return error(400, "The request body must be a JSON object.", "invalid_request_error")
    routes = caches()[0]
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return error(400, "'model' is required and must be a string.", "invalid_request_error",
                     param="model")
    wrong = request_check.problems(path, body)
    if wrong:
        return error(400, wrong[0], "invalid_request_error", param=wrong[1])
    key = request.llmgw_key
    if model not in routes.models:
        # Only what this key may use: the others are none of its business.
        names = ", ".join(n for n in sorted(routes.models) if quota.allowed(key, n)) or "none"
        return error(404, f"The model '{model}' does not exist (models this key may use: {names}).",
                     "invalid_request_error", "model_not_found", "model")
    if not quota.allowed(key, model):
        return error(403, f"This API key may not use the model '{model}' (it may use: "
                          f"{', '.join(key.models)}).", "invalid_request_error", "model_not_allowed",
                     "model")
    session = request.headers.get("X-Session-Id") or str(body.get("user") or "")
    allowed = functools.partial(quota.allowed, key)
    served, endpoints = routes.serve_with(model, allowed, session)
    if not endpoints:
        # Before a 503, a fresher look: another worker may already route to a new replica.
        routes.refresh(FRESH_BEFORE_503_SECONDS)
        served, endpoints = routes.serve_with(model, allowed, session)
    if not endpoints:
        states = collections.Counter(routes.models[model]["not_ready"])
        why = ", ".join(f"{n} × {what}" if n > 1 else what for what, n in states.items()) \
            or "no replica has been placed yet"
        return error(503, f"No ready replica of '{model}': {why}. Administrators see why on the "
                          f"model's page.", "server_error", "no_ready_replica",
                     headers={"Retry-After": "5"})
    try:
        reservation = quota.reserve(key, served, body, current_app.config["LLMGW"],
                                    relay_mod.settlement().ledger, lookups=caches()[2])
    except quota.LimitExceeded as e:
        relay_mod.settlement().refused(key.id, e.kind)
        metrics.refused(e.scope, e.kind)
        return error(429, str(e), e.kind, e.code, headers={"Retry-After": str(e.retry_after)})
    if served != model:
        body = dict(body, model=served)
    if path != "embeddings" and not any(isinstance(body.get(k), int) and not isinstance(body.get(k), bool)
                                        and body.get(k) > 0 for k in ("max_tokens", "max_completion_tokens")):
        # What was reserved for each choice is what the engine is told it may generate:
        # left to itself it stops only at the end of its context.
        body = dict(body, max_tokens=current_app.config["LLMGW"]["limits"]["default_max_tokens"])
    return relay_mod.forward(endpoints, path, body, reservation, routes)
