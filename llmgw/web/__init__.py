"""Web: one blueprint per noun. Pages render templates; HTMX asks for the partials."""
import functools
import secrets

from flask import abort, request, session
from flask.sessions import SecureCookieSessionInterface
from flask_login import LoginManager, current_user, login_required

from ..models import User

login_manager = LoginManager()
login_manager.login_view = "auth.login"
login_manager.login_message = "Log in to see the cluster."


@login_manager.user_loader
def _load_user(user_id):
    from .auth import LoginUser
    user = User.get_or_none(User.id == int(user_id))
    return LoginUser(user) if user and user.is_active else None


def csrf_token():
    """Return this session's CSRF token, creating it on first use."""
    if "csrf" not in session:
        session["csrf"] = secrets.token_urlsafe(24)
    return session["csrf"]


def _check_csrf():
    if request.method != "POST" or request.blueprint in ("gateway", None):
        return
    sent = request.form.get("csrf_token") or request.headers.get("X-CSRF-Token")
    if not sent or sent != session.get("csrf"):
        abort(400, "The form's CSRF token is missing or stale; reload the page and try again.")


def admin_required(view):
    """Let only administrators through (checked on the server, whatever the page shows)."""
    @functools.wraps(view)
    @login_required
    def wrapper(*args, **kwargs):
        if not getattr(current_user, "is_admin", False):
            abort(403, "This page is for administrators.")
        return view(*args, **kwargs)
    return wrapper


class NoSessionsForTheApi(SecureCookieSessionInterface):
    """API clients carry a key, not a cookie: /v1/ skips reading and signing the session
    cookie (a twentieth of a relayed request's CPU)."""

    def open_session(self, app, request):
        if request.path.startswith("/v1/"):
            return self.null_session_class()
        return super().open_session(app, request)


def is_htmx():
    """Return whether this request came from HTMX (so a partial is wanted)."""
    return request.headers.get("HX-Request") == "true"


def register(app):
    from . import accounts, auth, cluster, gateway, health, mirror, models, quotas

    login_manager.init_app(app)
    app.session_interface = NoSessionsForTheApi()
    app.jinja_env.globals["csrf_token"] = csrf_token
    from ..plans import money
    app.jinja_env.filters["money"] = money.show
    app.before_request(_check_csrf)
    for module in (accounts, auth, cluster, gateway, health, mirror, models, quotas):
        app.register_blueprint(module.bp)
    gateway.json_errors(app)
