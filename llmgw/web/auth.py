"""Log in and out."""
import urllib.parse

from flask import Blueprint, current_app, flash, redirect, render_template, request, session, url_for
from flask_login import UserMixin, current_user, login_required, login_user, logout_user

from .. import security
from ..services import logins
from ..models import User, new_session_token

bp = Blueprint("auth", __name__)


class LoginUser(UserMixin):
    def __init__(self, user):
        self.user = user
        self.id = str(user.id)
        self.email = user.email
        self.is_admin = user.is_admin
        self.session_token = user.session_token

    def get_id(self):
        # What the session cookie keeps: the account and its current session token, which
        # logout and a password change replace (web.load_user compares them).
        return f"{self.id}:{self.session_token}"


def end_sessions(user_id):
    """End every login session of an account: its session token is replaced."""
    User.update(session_token=new_session_token()).where(User.id == int(user_id)).execute()


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
        conf = current_app.config["LLMGW"]
        counted = logins.subjects(email, request.remote_addr, conf)
        wait = logins.attempt(counted, conf["accounts"]["login_lockout"])
        if wait:
            # Refused before the hash: a guesser gets no answer and costs no CPU.
            flash(f"Too many failed logins for this account or from this address; try again in "
                  f"{(wait + 59) // 60} minute(s).")
            return render_template("login.html"), 429, {"Retry-After": str(wait)}
        user = User.get_or_none(User.email == email)
        matched = security.check_password(user.password_hash if user else None,
                                          request.form.get("password", ""))
        if matched and user.is_active:
            logins.succeeded(counted)
            session.pop("csrf_token", None)  # a new CSRF token for the logged-in session
            login_user(LoginUser(user))
            return redirect(safe_next(request.args.get("next", "")) or url_for("cluster.index"))
        flash("That email and password do not match an active account.")
    return render_template("login.html"), (401 if request.method == "POST" else 200)


@bp.post("/logout")
@login_required
def logout():
    # Also every copy of this session's cookie, and the account's other sessions.
    end_sessions(current_user.id)
    logout_user()
    return redirect(url_for("auth.login"))
