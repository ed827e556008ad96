"""Which reconciler leads: one at a time, however many control planes share the database.

SQLite: a file lock beside the database (every control plane of one SQLite file is on one
machine). PostgreSQL: a session advisory lock, held by a connection of the reconciler's own;
the server lets go of it when that connection ends, so a control plane that dies or is cut
off from the database hands the lead to a standby without anyone's help.
"""
import fcntl
import logging
import os
import urllib.parse
from pathlib import Path

log = logging.getLogger("llmgw.leader")

# pg_try_advisory_lock takes one bigint: "llmgwrec" as eight bytes.
ADVISORY_KEY = int.from_bytes(b"llmgwrec", "big") - (1 << 63)
MIGRATION_KEY = ADVISORY_KEY + 1


class FileLock:
    """A flock held for the reconciler's lifetime."""

    def __init__(self, path):
        self.path = Path(path)
        self.fd = None

    def try_acquire(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd
        return True

    def holds(self):
        return self.fd is not None  # a flock is not taken away from a living process

    def abandon(self):
        pass  # nothing can hang: the lock is the process's own

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def describe(self):
        return f"the file lock {self.path}"


class AdvisoryLock:
    """A PostgreSQL session advisory lock on a dedicated connection."""

    def __init__(self, url, key=ADVISORY_KEY):
        from .db import postgres_params
        self.params, self.key, self.conn = postgres_params(url), key, None

    def try_acquire(self):
        import psycopg2
        self.release()
        conn = None
        try:
            # Bounded on this side too: a query unanswered for 5 s fails, and unacknowledged
            # data for 10 s drops the connection (keepalives alone do not cover that case).
            conn = psycopg2.connect(**dict(self.params, application_name="llmgw reconciler",
                                           tcp_user_timeout=10000,
                                           options="-c statement_timeout=5000"))
            conn.autocommit = True
            with conn.cursor() as cur:
                # The server side of keepalives: a leader whose machine vanished (no FIN, no
                # RST) loses the lock after about 20 s instead of the kernel's two hours.
                cur.execute("SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 3; "
                            "SET tcp_keepalives_count = 3")
                cur.execute("SELECT pg_try_advisory_lock(%s)", (self.key,))
                got = cur.fetchone()[0]
        except psycopg2.Error as e:
            log.warning("cannot reach the database to take the lead: %s", str(e).strip())
            got = False
        if not got:
            if conn is not None:
                conn.close()
            return False
        self.conn = conn
        return True

    def abandon(self):
        """Give up the lead without waiting on the connection (a check that hangs): forget it
        here, and let a check still running on it close it when it returns."""
        self.conn = None

    def holds(self):
        """Ask the server whether this connection still holds the lock (blocking; seconds at worst)."""
        import psycopg2
        conn = self.conn
        if conn is None:
            return False
        try:
            with conn.cursor() as cur:
                # A bigint key shows in pg_locks as its high and low 32 bits.
                cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                            "AND pid = pg_backend_pid() AND objsubid = 1 "
                            "AND classid = ((%(k)s::bigint >> 32) & 4294967295)::oid "
                            "AND objid = (%(k)s::bigint & 4294967295)::oid", {"k": self.key})
                held = cur.fetchone()[0] > 0
        except psycopg2.Error as e:
            log.warning("lost the database connection that holds the lead: %s", str(e).strip())
            held = False
        if self.conn is not conn:  # abandoned while this check ran: nobody else will close it
            conn.close()
            return False
        if not held:
            self.release()
        return held

    def release(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except Exception:  # already broken: closing is all that is left to do
                pass
            self.conn = None

    def describe(self):
        p = self.params
        return f"the advisory lock {self.key} on {p['host']}:{p['port']}/{p['dbname']}"


def lock_for(conf):
    """Return the leader lock that fits the configured database."""
    url = conf["database"]["url"]
    if urllib.parse.urlparse(url).scheme in ("postgres", "postgresql"):
        return AdvisoryLock(url)
    return FileLock(Path(conf["_root"]) / "reconciler.lock")


def someone_leads(conf):
    """Return whether a reconciler holds the lead now (taking the lock for a moment to see)."""
    lock = lock_for(conf)
    if lock.try_acquire():
        lock.release()
        return False
    return True
