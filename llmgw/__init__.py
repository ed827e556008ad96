"""llmgw: SSH-managed nodes behind one OpenAI-compatible endpoint."""
from pathlib import Path

from flask import Flask

__version__ = "0.1.0"

TOP = Path(__file__).resolve().parent.parent


def create_app(test_config=None):
    """Build the Flask app from the configuration (or test_config, which wins)."""
    from . import config, db
    from .cli import register as register_cli
    from .web import register as register_web

    app = Flask(__name__, template_folder=str(TOP / "templates"),
                static_folder=str(TOP / "static"))
    conf = config.load((test_config or {}).get("ROOT"))
    app.config["LLMGW"] = conf
    app.config["SECRET_KEY"] = conf["server"]["secret_key"] or "not-initialised"
    app.config["SESSION_COOKIE_HTTPONLY"] = True
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"
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
    app.config["LLMGW"] = conf
    app.config["SECRET_KEY"] = conf["server"]["secret_key"] or "not-initialised"
    db.bind(conf["database"]["url"])
    return conf
