"""Reach a replica's engine the way the gateway does: with the API key it was started with.

Read from the control plane's database and key file, as a test that talks to an engine
directly (to watch it drain, or to count what it works on) must.
"""
import sqlite3
from pathlib import Path

from llmgw import secrets_box


def engine_auth(root, endpoint):
    """Return the Authorization header for the replica serving at endpoint (http://host:port)."""
    with sqlite3.connect(Path(root) / "llmgw.db") as db:
        row = db.execute("SELECT engine_key FROM replica WHERE endpoint = ?", (endpoint,)).fetchone()
    assert row and row[0], f"no replica with an engine key serves at {endpoint}"
    return {"Authorization": "Bearer " + secrets_box.unseal(str(Path(root).resolve()), row[0])}
