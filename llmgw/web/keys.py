"""API keys in the browser: everyone makes, sees and revokes their own on the profile page;
administrators see and revoke every key. And a person's home: their projects, keys and usage."""
import datetime

import peewee
from flask import Blueprint, abort, flash, make_response, redirect, render_template, request, url_for
from flask_login import current_user, login_required

from ..errors import LlmgwError
from ..models import ApiKey, LimitRule, Membership, Project, Usage, User, utcnow
from ..services import tenancy
from . import admin_required

bp = Blueprint("keys", __name__)


def _me():
    return User.get_by_id(int(current_user.id))


def _member_of(user):
    return list(Project.select().join(Membership).where(Membership.user == user).order_by(Project.name))


def _projects_of(user):
    """The projects a person may make keys in: their own; every project for administrators."""
    return list(Project.select().order_by(Project.name)) if user.is_admin else _member_of(user)


def keys_context(user, new_key=None):
    return {"keys": tenancy.key_views(user=user), "projects": _projects_of(user), "new_key": new_key}


@bp.post("/profile/keys")
@login_required
def create():
    """Make a key for oneself in one of one's projects; the page shows it once."""
    user = _me()
    project = request.form.get("project", "")
    if project not in {p.name for p in _projects_of(user)}:
        abort(403, f"You are not a member of the project {project!r}; ask an administrator.")
    models = [m.strip() for m in request.form.get("models", "").split(",") if m.strip()] or None
    raw_days = request.form.get("expires_days", "").strip()
    try:
        days = int(raw_days) if raw_days else None
        if days is not None and not 1 <= days <= tenancy.MAX_KEY_DAYS:
            raise ValueError
    except ValueError:
        flash(f"Key not made: expiry {raw_days!r} is not a whole number of days from 1 to "
              f"{tenancy.MAX_KEY_DAYS} (empty: never).")
        return redirect(url_for("accounts.profile"))
    try:
        row, key = tenancy.create_key(project, request.form.get("name", "").strip(), user=user,
                                      models=models, expires_days=days)
    except LlmgwError as e:
        flash(f"Key not made: {e}")
        return redirect(url_for("accounts.profile"))
    # Rendered, not redirected: the key is shown in this answer only, never kept in a cookie
    # or a cache.
    page = make_response(render_template("profile.html", user=user, **keys_context(user, new_key=(row, key))))
    page.headers["Cache-Control"] = "no-store"
    return page


@bp.post("/keys/<int:key_id>/revoke")
@login_required
def revoke(key_id):
    row = ApiKey.get_or_none(ApiKey.id == key_id)
    if row is None or (row.user_id != int(current_user.id) and not current_user.is_admin):
        abort(404, "There is no such key of yours.")
    if row.revoked is not None:
        flash(f"Key {row.prefix}… was already revoked.")
    else:
        ApiKey.update(revoked=utcnow()).where(ApiKey.id == row.id).execute()
        flash(f"Revoked {row.prefix}…; it stops working within 5 seconds.")
    back = request.form.get("back")
    return redirect(back if back in (url_for("keys.all_keys"), url_for("accounts.profile"), url_for("keys.home"))
                    else url_for("accounts.profile"))


@bp.get("/admin/keys")
@admin_required
def all_keys():
    project = request.args.get("project") or None
    try:
        rows = tenancy.key_views(project)
    except LlmgwError as e:
        abort(404, str(e))
    return render_template("keys.html", keys=rows, project=project,
                           projects=list(Project.select().order_by(Project.name)))


@bp.get("/home")
@login_required
def home():
    """A person's own page: their projects with this month's use and limits, their keys."""
    user = _me()
    projects = _member_of(user)
    since = utcnow() - datetime.timedelta(days=30)
    used = {r["project_id"]: r for r in Usage.select(
        Usage.project_id, peewee.fn.COUNT(Usage.id).alias("requests"),
        peewee.fn.SUM(Usage.prompt_tokens + Usage.completion_tokens).alias("tokens"),
        peewee.fn.SUM(Usage.cost).alias("cost")).where(
        Usage.project_id.in_([p.id for p in projects]), Usage.created >= since).group_by(Usage.project_id).dicts()} \
        if projects else {}
    limits = {r.scope_id: r for r in LimitRule.select().where(
        LimitRule.scope_kind == "project", LimitRule.scope_id.in_([p.id for p in projects]))} if projects else {}
    return render_template("home.html", user=user, projects=projects, used=used, limits=limits,
                           keys=tenancy.key_views(user=user))
