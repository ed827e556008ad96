"""/health: the process answers and its database can be read."""
import logging

from flask import Blueprint, jsonify

from ..models import Node, database

bp = Blueprint("health", __name__)
log = logging.getLogger("llmgw.health")


@bp.get("/health")
def health():
    try:
        nodes = Node.select().count()
    except Exception as e:  # the point of /health is to say so, not to raise
        # Anyone may ask: the driver's words (the database's host, a path) go to the log.
        log.warning("/health: the database does not answer: %s", e)
        return jsonify({"status": "error", "database": "not answering"}), 503
    return jsonify({"status": "ok", "nodes": nodes, "database": type(database.obj).__name__})
