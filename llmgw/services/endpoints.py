"""External OpenAI-compatible servers: registered, health-checked, routed to like replicas."""
import re
import urllib.parse

import requests

from .. import secrets_box
from ..errors import LlmgwError
from ..executors.probes import probe as on_probe_thread
from ..models import Endpoint, utcnow
from ..plans.nodespec import NAME


def add(root, name, url, models, api_key=""):
    """Register (or update) an endpoint; url is its OpenAI base URL, ending in /v1."""
    if not NAME.match(name):
        raise LlmgwError(f"{name!r} is not a usable endpoint name: lower-case letters, digits, dashes.")
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise LlmgwError(f"--url {url!r} is not an http(s) URL; give the OpenAI base URL, "
                         f"e.g. http://10.0.0.5:8000/v1.")
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names or not all(re.fullmatch(r"[^\s]{1,128}", m) for m in names):
        raise LlmgwError(f"--model {models!r}: give one or more model names, separated by commas.")
    fields = dict(url=url.rstrip("/"), models=names, api_key=secrets_box.seal(root, api_key),
                  state="pending", detail="not checked yet", updated=utcnow())
    row = Endpoint.get_or_none(Endpoint.name == name)
    if row:
        Endpoint.update(**fields).where(Endpoint.id == row.id).execute()
    else:
        Endpoint.create(name=name, **fields)
    return Endpoint.get(Endpoint.name == name)


def remove(name):
    """Forget an endpoint: the gateway stops routing to it within gateway.route_cache_seconds."""
    row = Endpoint.get_or_none(Endpoint.name == name)
    if row is None:
        names = ", ".join(e.name for e in Endpoint.select().order_by(Endpoint.name)) or "none"
        raise LlmgwError(f"no endpoint called {name!r} (endpoints: {names}).")
    row.delete_instance()
    return row


def probe(url, key, timeout=5):
    """Return (ok, detail) from GET {url}/models."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = requests.get(url + "/models", headers=headers, timeout=timeout)
    except requests.RequestException as e:
        return False, f"{url}/models did not answer: {e}"
    if resp.status_code != 200:
        return False, f"{url}/models answered {resp.status_code}"
    return True, f"{url} answers"


async def check_all(root):
    """Health-check every external endpoint (run by the reconciler each pass)."""
    for ep in list(Endpoint.select()):
        try:
            ok, detail = await on_probe_thread(probe, ep.url, secrets_box.unseal(root, ep.api_key,
                                                                                 f"endpoint {ep.name}"))
        except secrets_box.Unreadable as e:
            ok, detail = False, str(e)
        state = "ready" if ok else "unreachable"
        if (state, detail) != (ep.state, ep.detail):
            Endpoint.update(state=state, detail=detail, updated=utcnow()).where(
                Endpoint.id == ep.id).execute()
