"""Errors in OpenAI's JSON shape."""
from flask import jsonify


def error(status, message, kind, code=None, param=None, headers=None):
    """Return an error in OpenAI's JSON shape."""
    resp = jsonify({"error": {"message": message, "type": kind, "param": param, "code": code}})
    resp.status_code = status
    for k, v in (headers or {}).items():
        resp.headers[k] = v
    return resp
