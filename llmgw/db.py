"""The peewee database: opened from the configured URL, one connection per request or task."""
import threading
import time
import urllib.parse

import peewee
from playhouse.pool import PooledPostgresqlDatabase, PooledSqliteDatabase

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
        # check_same_thread off: the pool hands a connection to one thread at a time, but not
        # always to the thread that opened it (the settlement thread returns them too).
        return _Sqlite(path, max_connections=None, stale_timeout=600,
                       check_same_thread=False, pragmas={
            "journal_mode": "wal", "busy_timeout": 10000, "foreign_keys": 1,
            "synchronous": "normal"})
    if parsed.scheme in ("postgres", "postgresql"):
        return _postgresql(url)
    raise ConfigError(f"database.url {url!r} is neither sqlite:///PATH nor postgresql://…; "
                      f"fix it in the config file.")


class _Sqlite(PooledSqliteDatabase):
    """SQLite whose transactions take the write lock when they begin (BEGIN IMMEDIATE).

    A plain BEGIN starts as a reader. In WAL mode, when another connection commits a write
    after that reader's first read, the reader's own first write fails at once with "database
    is locked": the busy timeout does not apply, because waiting could not make its snapshot
    current. `model set` failed that way while the settlement thread wrote usage. Taken up
    front, the lock is waited for (busy_timeout) like any other write."""

    def begin(self, lock_type=None):
        super().begin(lock_type or "IMMEDIATE")


def postgres_params(url):
    """Return psycopg2.connect() keywords for a postgresql:// URL, or raise ConfigError."""
    try:
        import psycopg2  # noqa: F401
    except ImportError as e:
        raise ConfigError("database.url is PostgreSQL but its driver is not installed; "
                          "pip install 'llmgw[postgresql]' (psycopg2-binary) and start again.") from e
    parsed = urllib.parse.urlparse(url)
    name = urllib.parse.unquote(parsed.path.lstrip("/"))
    if not name:
        shown = parsed._replace(netloc=parsed.hostname or "").geturl()  # never echo a password
        raise ConfigError(f"database.url {shown!r} names no database; write "
                          f"postgresql://USER:PASSWORD@HOST:PORT/DATABASE in the config file.")
    # Keepalives: a control plane cut off from the server finds out in seconds, not hours.
    params = {"dbname": name, "host": parsed.hostname, "port": parsed.port or 5432,
              "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 3,
              "keepalives_count": 3, "connect_timeout": 10,
              "application_name": "llmgw"}
    if parsed.username:
        params["user"] = urllib.parse.unquote(parsed.username)
    if parsed.password:
        params["password"] = urllib.parse.unquote(parsed.password)
    for name, value in urllib.parse.parse_qsl(parsed.query):  # ?sslmode=require and the like
        if name not in LIBPQ_PARAMS:
            raise ConfigError(f"database.url sets {name!r}, which llmgw does not pass on; it takes "
                              f"{', '.join(sorted(LIBPQ_PARAMS))}. Remove it from the URL.")
        params[name] = value
    return params


# libpq connection parameters a URL may set (not dbname, user or host: the URL's own parts).
LIBPQ_PARAMS = {"sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl",
                "channel_binding", "gssencmode", "target_session_attrs", "application_name",
                "connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                "keepalives_count", "tcp_user_timeout", "options", "passfile", "service"}


class GreenPooledPostgresqlDatabase(PooledPostgresqlDatabase):
    """Under gevent psycopg2 connects through the wait callback, where libpq's connect_timeout
    does not apply: a server that never answers would hold the worker's pool for the kernel's
    two minutes of SYN retries. Here a new connection gets connect_timeout seconds."""

    def _connect(self):
        if not _green:
            return super()._connect()
        import gevent
        seconds = float(self.connect_params.get("connect_timeout") or 10)
        try:
            with gevent.Timeout(seconds):
                return super()._connect()
        except gevent.Timeout:
            raise peewee.OperationalError(f"no connection to PostgreSQL within {seconds:g} s "
                                          f"(connect_timeout)") from None


def _postgresql(url):
    params = postgres_params(url)
    make_green_if_gevent()
    return GreenPooledPostgresqlDatabase(params.pop("dbname"), max_connections=None,
                                         stale_timeout=600, **params)


_green = False


def _gevent_wait(conn, timeout=None):
    """psycopg2's wait callback under gevent: yield to the hub while the server answers."""
    from gevent.socket import wait_read, wait_write
    from psycopg2 import OperationalError, extensions
    while True:
        state = conn.poll()
        if state == extensions.POLL_OK:
            return
        if state == extensions.POLL_READ:
            wait_read(conn.fileno(), timeout=timeout)
        elif state == extensions.POLL_WRITE:
            wait_write(conn.fileno(), timeout=timeout)
        else:
            raise OperationalError(f"unexpected state {state!r} from psycopg2's poll()")


def make_green_if_gevent():
    """Under gevent (the gunicorn workers), make psycopg2 wait cooperatively; without this one
    slow query would stop every request of the worker."""
    try:
        from gevent import monkey
    except ImportError:
        return False
    if not monkey.is_module_patched("socket"):
        return False
    from psycopg2 import extensions
    global _green
    extensions.set_wait_callback(_gevent_wait)
    _green = True
    return True


# What a query raises when the database cannot be reached (refused, timed out, dropped), as
# opposed to a query it refuses.
AWAY = (peewee.OperationalError, peewee.InterfaceError)


class DatabaseAway(Exception):
    """The database cannot be reached for something a request needs."""


AWAY_RETRY_SECONDS = 1.0


def cached(entries, reading, what, ttl, make):
    """Return entries[what] if it was read less than ttl seconds ago, else read it with make().

    One caller at a time reads: under gevent a query yields to the hub while PostgreSQL
    answers, and every request arriving meanwhile found the same entry expired and ran the same
    queries again (one worker, 32 requests at a time: up to 32 reads of a key's limits per
    second instead of one). The others wait for that read and take its value: a value older than
    ttl is never used while the database answers (a limit set a second ago binds every request
    after it). While the database is away the last value is served and read again after
    AWAY_RETRY_SECONDS; an entry never read raises DatabaseAway.

    reading: the reads under way for these entries (what -> Event), a dict kept beside them.
    """
    while True:
        hit = entries.get(what)
        now = time.monotonic()
        if hit is not None and now - hit[1] < ttl:
            return hit[0]
        under_way = reading.get(what)
        if under_way is None:
            break
        under_way.wait(60)  # then look again: it read, or failed and the next one tries
    done = reading[what] = threading.Event()
    try:
        value = make()
    except AWAY as e:
        if hit is None:
            raise DatabaseAway(str(e).strip()) from e
        entries[what] = (hit[0], now - ttl + min(ttl, AWAY_RETRY_SECONDS))
        return hit[0]
    finally:
        del reading[what]
        done.set()
    entries[what] = (value, time.monotonic())
    return value


def bind(url):
    """Point the shared proxy at the database for this URL."""
    db = open_database(url)
    database.initialize(db)
    return db


def init_app(app):
    """Bind the database for the app; a request takes a pooled connection when it first runs
    a query (a relayed request with warm caches runs none) and gives it back at its end."""
    bind(app.config["LLMGW"]["database"]["url"])

    @app.teardown_request
    def _close(exc):
        if not database.is_closed():
            database.close()
