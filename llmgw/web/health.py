"""/health: the process answers and its database can be read."""
from flask import Blueprint, jsonify

from ..models import Node, database

bp = Blueprint("health", __name__)


@bp.get("/health")
def health():
    try:
        nodes = Node.select().count()
    except Exception as e:  # the point of /health is to say so, not to raise
        return jsonify({"status": "error", "database": str(e)}), 503
    return jsonify({"status": "ok", "nodes": nodes, "database": type(database.obj).__name__})
