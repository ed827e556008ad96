"""Log in and out."""
import urllib.parse

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


def safe_next(target):
    """Return target when it is a path on this site, else '' (no open redirect)."""
    parts = urllib.parse.urlsplit(target)
    if (not target.startswith("/") or parts.scheme or parts.netloc
            or any(c == "\\" or ord(c) < 32 for c in target) or target.startswith("//")):
        return ""
    return target


@bp.route("/login", methods=["GET", "POST"])
def login():
    if request.method == "POST":
        email = request.form.get("email", "").strip()
        user = User.get_or_none(User.email == email)
        if user and user.is_active and security.check_password(user.password_hash,
                                                               request.form.get("password", "")):
            login_user(LoginUser(user))
            return redirect(safe_next(request.args.get("next", "")) or url_for("cluster.index"))
        flash("That email and password do not match an active account.")
    return render_template("login.html"), (401 if request.method == "POST" else 200)


@bp.post("/logout")
@login_required
def logout():
    logout_user()
    return redirect(url_for("auth.login"))
