"""The peewee database: opened from the configured URL, one connection per request or task."""
import urllib.parse

import peewee
from playhouse.pool import PooledSqliteDatabase

from .errors import ConfigError

database = peewee.DatabaseProxy()


def open_database(url):
    """Return a peewee database for a sqlite:/// or postgresql:// URL."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme == "sqlite":
        path = parsed.path if not parsed.netloc else parsed.netloc + parsed.path
        # WAL lets the web workers read while the reconciler writes; the busy
        # timeout turns a short write collision into a wait instead of an error.
        # Pooled: a request (a greenlet under gevent) takes an open connection and gives it
        # back, instead of opening the file and setting its pragmas every time.
        return PooledSqliteDatabase(path, max_connections=None, stale_timeout=600, pragmas={
            "journal_mode": "wal", "busy_timeout": 10000, "foreign_keys": 1,
            "synchronous": "normal"})
    if parsed.scheme in ("postgres", "postgresql"):
        try:
            return peewee.PostgresqlDatabase(
                parsed.path.lstrip("/"), user=parsed.username, password=parsed.password,
                host=parsed.hostname, port=parsed.port or 5432)
        except peewee.ImproperlyConfigured as e:
            raise ConfigError("database.url is PostgreSQL but no driver is installed; "
                              "pip install psycopg2-binary") from e
    raise ConfigError(f"database.url {url!r} is neither sqlite:///PATH nor postgresql://…; "
                      f"fix it in the config file.")


def bind(url):
    """Point the shared proxy at the database for this URL."""
    db = open_database(url)
    database.initialize(db)
    return db


def init_app(app):
    """Bind the database for the app and open/close a connection around each request."""
    bind(app.config["LLMGW"]["database"]["url"])

    @app.before_request
    def _connect():
        database.connect(reuse_if_open=True)

    @app.teardown_request
    def _close(exc):
        if not database.is_closed():
            database.close()
