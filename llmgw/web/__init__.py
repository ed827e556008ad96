"""Web: one blueprint per noun. Pages render templates; HTMX asks for the partials."""
import functools
import hmac

from flask import abort, request
from flask.sessions import SecureCookieSessionInterface
from flask_login import LoginManager, current_user, login_required
from flask_wtf.csrf import CSRFError, CSRFProtect

from ..models import User

login_manager = LoginManager()
login_manager.login_view = "auth.login"
login_manager.login_message = "Log in to see the cluster."


@login_manager.user_loader
def _load_user(session_id):
    """The account of a session id "USER:TOKEN" while TOKEN is still the account's (logout and
    a password change replace it); None otherwise, which sends the browser to the login page."""
    from .auth import LoginUser
    user_id, _, token = str(session_id).partition(":")
    if not user_id.isdigit() or not token:
        return None  # a session from before tokens, or made up
    user = User.get_or_none(User.id == int(user_id))
    if user is None or not user.is_active or not hmac.compare_digest(user.session_token, token):
        return None
    return LoginUser(user)


csrf = CSRFProtect()


def _csrf_refused(e):
    return (f"The form's CSRF token is missing or stale ({e.description}); reload the page and "
            "try again.", 400)


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
    from . import (accounts, auth, cluster, endpoints, gateway, health, keys, metrics, mirror, models,
                   projects, quotas)

    login_manager.init_app(app)
    app.session_interface = NoSessionsForTheApi()
    # CSRF from Flask-WTF: every POST, PUT, PATCH and DELETE of the pages carries the token
    # (a form field or the X-CSRF-Token header), compared in constant time; a request without
    # one is refused. The token lives as long as the session (it changes at login), not an
    # hour: an admin page left open must still submit. The API (keys, not cookies) is exempt.
    app.config.setdefault("WTF_CSRF_TIME_LIMIT", None)
    csrf.init_app(app)  # also the templates' csrf_token()
    csrf.exempt(gateway.bp)
    app.register_error_handler(CSRFError, _csrf_refused)
    from ..plans import money
    app.jinja_env.filters["money"] = money.show
    for module in (accounts, auth, cluster, endpoints, gateway, health, keys, metrics, mirror, models,
                   projects, quotas):
        app.register_blueprint(module.bp)
    gateway.json_errors(app)
