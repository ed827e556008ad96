"""The mirror's admin page: what the control plane's cache holds, and removing unused entries."""
from flask import Blueprint, current_app, flash, redirect, render_template, url_for

from ..errors import LlmgwError
from ..services import mirror
from ..plans.sizing import human_bytes
from . import admin_required

bp = Blueprint("mirror", __name__)


@bp.get("/mirror")
@admin_required
def mirror_page():
    rows = mirror.entries(current_app.config["LLMGW"])
    return render_template("mirror.html", rows=rows, human=human_bytes)


@bp.post("/mirror/<name>/remove")
@admin_required
def mirror_remove(name):
    try:
        flash(mirror.remove(current_app.config["LLMGW"], name))
    except (LlmgwError, OSError) as e:
        flash(f"{name} was not removed: {e}")
    return redirect(url_for("mirror.mirror_page"))
