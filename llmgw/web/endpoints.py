"""External endpoints in the browser: list with health, add, remove (as `llmgw endpoint …`)."""
from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for

from ..errors import LlmgwError
from ..models import Endpoint
from ..services import endpoints
from . import admin_required, is_htmx

bp = Blueprint("endpoints", __name__)


@bp.get("/endpoints")
@admin_required
def endpoints_page():
    template = "_endpoints_table.html" if is_htmx() else "endpoints.html"  # health, polled
    return render_template(template, endpoints=list(Endpoint.select().order_by(Endpoint.name)))


@bp.post("/endpoints")
@admin_required
def endpoint_action():
    action, name = request.form.get("action", ""), request.form.get("name", "").strip()
    try:
        if action == "add":
            row = endpoints.add(current_app.config["LLMGW"]["_root"], name, request.form.get("url", "").strip(),
                                request.form.get("models", ""), request.form.get("api_key", ""))
            flash(f"Endpoint {row.name} added; it is routed to once the reconciler finds "
                  f"{row.url}/models answering (a few seconds).")
        elif action == "remove":
            row = endpoints.remove(name)
            flash(f"Endpoint {row.name} removed; the gateway stops routing there within seconds.")
        else:
            raise LlmgwError(f"unknown action {action!r}: add or remove.")
    except LlmgwError as e:
        flash(f"Endpoint {name or '(no name)'} not changed: {e}")
    return redirect(url_for("endpoints.endpoints_page"))
