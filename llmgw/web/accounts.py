"""Sign-up, one's own profile, and the administrators' page of accounts."""
from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from flask_login import current_user, login_required, login_user

from ..errors import LlmgwError
from ..models import Project, User
from ..services import tenancy
from . import admin_required
from .auth import LoginUser, end_sessions
from .keys import keys_context

bp = Blueprint("accounts", __name__)


@bp.route("/signup", methods=["GET", "POST"])
def signup():
    if current_app.config["LLMGW"]["accounts"]["signup"] != "open":
        abort(404, "Sign-up is closed here; ask an administrator for an account.")
    if request.method == "POST":
        try:
            tenancy.sign_up(request.form.get("email", "").strip(), request.form.get("password", ""))
        except LlmgwError as e:
            flash(str(e))
            return render_template("signup.html"), 400
        flash("Thank you. An administrator has to approve the account before you can log in.")
        return redirect(url_for("auth.login"))
    return render_template("signup.html")


@bp.route("/profile", methods=["GET", "POST"])
@login_required
def profile():
    user = User.get_by_id(int(current_user.id))
    if request.method == "POST":
        new = request.form.get("new", "")
        try:
            if new != request.form.get("again", ""):
                raise LlmgwError("the two new passwords differ.")
            tenancy.change_password(user, request.form.get("current", ""), new)
        except LlmgwError as e:
            flash(f"Password not changed: {e}")
            return render_template("profile.html", user=user, **keys_context(user)), 400
        # Every other session of the account ends; this browser gets a new one.
        end_sessions(user.id)
        login_user(LoginUser(User.get_by_id(user.id)))
        flash("Password changed; your other sessions have been logged out.")
        return redirect(url_for("accounts.profile"))
    return render_template("profile.html", user=user, **keys_context(user))


@bp.get("/admin/users")
@admin_required
def users():
    return render_template("users.html", users=list(User.select().order_by(User.is_active, User.email)),
                           projects=list(Project.select().order_by(Project.name)))


@bp.post("/admin/users/<int:user_id>/<action>")
@admin_required
def user_action(user_id, action):
    user = User.get_or_none(User.id == user_id)
    if user is None:
        abort(404, "No such account.")
    try:
        if action == "approve":
            tenancy.approve(user.email, request.form.get("project", "default"))
        elif action in ("promote", "demote"):
            tenancy.set_admin(user.email, action == "promote")
        else:
            abort(404, f"Unknown action {action!r}.")
    except LlmgwError as e:
        flash(str(e))
    return redirect(url_for("accounts.users"))
