"""Log in and out."""
from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask_login import UserMixin, login_required, login_user, logout_user

from .. import security
from ..models import User

bp = Blueprint("auth", __name__)


class LoginUser(UserMixin):
    def __init__(self, user):
        self.user = user
        self.id = str(user.id)
        self.email = user.email
        self.is_admin = user.is_admin


@bp.route("/login", methods=["GET", "POST"])
def login():
    if request.method == "POST":
        email = request.form.get("email", "").strip()
        user = User.get_or_none(User.email == email)
        if user and user.is_active and security.check_password(user.password_hash,
                                                               request.form.get("password", "")):
            login_user(LoginUser(user))
            target = request.args.get("next", "")
            return redirect(target if target.startswith("/") and not target.startswith("//")
                            else url_for("cluster.index"))
        flash("That email and password do not match an active account.")
    return render_template("login.html"), (401 if request.method == "POST" else 200)


@bp.post("/logout")
@login_required
def logout():
    logout_user()
    return redirect(url_for("auth.login"))
