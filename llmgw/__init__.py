"""llmgw: SSH-managed nodes behind one OpenAI-compatible endpoint."""
import secrets
from pathlib import Path

from flask import Flask

__version__ = "0.1.0"

TOP = Path(__file__).resolve().parent.parent


def create_app(test_config=None):
    """Build the Flask app from the configuration (or test_config, which wins)."""
    from . import config, db
    from .cli import register as register_cli
    from .errors import ConfigError
    from .web import register as register_web

    app = Flask(__name__, template_folder=str(TOP / "templates"),
                static_folder=str(TOP / "static"))
    try:
        conf = config.load((test_config or {}).get("ROOT"))
    except ConfigError as e:
        raise SystemExit(f"llmgw: {e}") from e
    _apply(app, conf)
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
    # A request body past this is refused with 413 before it is read.
    app.config["MAX_CONTENT_LENGTH"] = 16 * 1024 * 1024
    if test_config:
        app.config.update(test_config)
    db.init_app(app)
    register_web(app)
    register_cli(app)
    return app


def reconfigure(app, root):
    """Re-read configuration for another root (the CLI's --root) and rebind the database."""
    from . import config, db

    conf = config.load(root)
    _apply(app, conf)
    db.bind(conf["database"]["url"])
    return conf


def _apply(app, conf):
    app.config["LLMGW"] = conf
    # Without a configured secret (before init), a random one: sessions then last only as long
    # as this process, but nobody can forge one with a secret known from the source.
    app.config["SECRET_KEY"] = conf["server"]["secret_key"] or secrets.token_urlsafe(32)
    app.config["SESSION_COOKIE_SECURE"] = conf["server"]["public_url"].startswith("https://")
    app.config["REMEMBER_COOKIE_HTTPONLY"] = True
