"""How the control plane reaches a replica's engine over HTTP: its URL, its key, its health
and its load. The probes block; they run on the probe threads (executors/probes.py)."""
import logging
import time

import requests

from .. import secrets_box
from ..facts import metrics
from .serving import mgmt_address

log = logging.getLogger("llmgw.replicas")


def endpoint_of(node, port):
    """Return the URL the control plane reaches an engine on the node by: its management
    address when it has one (the engine listens there only), else the node's address."""
    host = "127.0.0.1" if node.transport == "local" else mgmt_address(node) or node.addr
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def _auth(key):
    return {"Authorization": f"Bearer {key}"} if key else {}


def engine_key(conf, replica):
    """Return the API key the replica's engine was started with ("" for none)."""
    return secrets_box.unseal(conf["_root"], replica.engine_key, f"replica {replica.name}")


def probe_key(conf, replica):
    """Return the key for probing the replica's engine, or "" when this control plane cannot
    open it (logged once). /health answers without one; the load probe then cannot say, so a
    leaving replica waits its grace. The engine is not restarted for it: the control plane that
    sealed the key still routes to it, and the fix is to copy the key file."""
    return secrets_box.unseal_or_log(conf["_root"], replica.engine_key, f"replica {replica.name}",
                                     log) or ""


def healthy(endpoint, key="", timeout=3, tries=2):
    """Return whether an engine answers /health with 200 (run in a thread).

    A second try after a short pause: one probe lost in a burst of traffic must not take a
    serving replica out of routing. The key goes along: llama-server answers /health to anyone,
    but an engine may guard every path.
    """
    for attempt in range(tries):
        try:
            if requests.get(endpoint + "/health", headers=_auth(key), timeout=timeout).status_code == 200:
                return True
        except requests.RequestException:
            pass
        if attempt + 1 < tries:
            time.sleep(0.5)
    return False


def engine_load(endpoint, key="", timeout=2):
    """Return running + queued requests from the engine's /metrics, or None (run in a thread)."""
    try:
        resp = requests.get(endpoint + "/metrics", headers=_auth(key), timeout=timeout)
    except requests.RequestException:
        return None
    return metrics.parse_load(resp.text) if resp.status_code == 200 else None
