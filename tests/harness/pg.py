"""A private PostgreSQL server for the tests: its own data dir, port and socket, on loopback.

Debian's postgresql package gives the binaries (/usr/lib/postgresql/<v>/bin) and the
`postgres` user; the server runs as that user when the tests run as root (initdb refuses
root), as the current user otherwise. Trust authentication on loopback only.

    with PostgresServer(tmp_path) as pg:
        url = pg.create_database("llmgw")   # postgresql://llmgw@127.0.0.1:PORT/llmgw
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .ports import free_port


def bin_dir() -> Path | None:
    """Return the newest installed PostgreSQL server's bin directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"),
                   key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0)
    return Path(found[-1]).parent if found else None


def missing_reason() -> str | None:
    """Say why a test PostgreSQL cannot run here, or None when it can."""
    if bin_dir() is None:
        return "PostgreSQL is not installed (apt-get install -y postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
    try:
        import psycopg2  # noqa: F401
    except ImportError:
        return "psycopg2 is not installed (pip install -e '.[test]')"
    return None


class PostgresServer:
    def __init__(self, workdir: Path):
        self.dir = Path(workdir) / "pg"
        self.data = self.dir / "data"
        self.port = free_port()
        self.proc = None
        self.bin = bin_dir()
        self.user = "postgres" if os.geteuid() == 0 else None

    def _as_user(self, argv):
        return ["runuser", "-u", self.user, "--", *argv] if self.user else argv

    def start(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.user:
            entry = pwd.getpwnam(self.user)
            shutil.chown(self.dir, entry.pw_uid, entry.pw_gid)
            # The server's user must be able to walk down to its data dir.
            for parent in self.dir.parents:
                if parent == Path("/"):
                    break
                mode = parent.stat().st_mode
                if not mode & 0o001:
                    parent.chmod(mode | 0o001)
        subprocess.run(self._as_user([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust",
                                      "-U", "postgres", "--no-sync", "-E", "UTF8"]),
                       check=True, capture_output=True, text=True)
        return self.resume()

    def resume(self):
        """Start the server on the data dir it already has (after stop())."""
        self.log = open(self.dir / "server.log", "a")
        self.proc = subprocess.Popen(self._as_user([
            str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
            "-c", "fsync=off", "-c", "max_connections=300"]),
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("postgres exited: " + (self.dir / "server.log").read_text()[-2000:])
            ready = subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                   capture_output=True)
            if ready.returncode == 0:
                return self
            time.sleep(0.2)
        raise RuntimeError("postgres did not get ready in 30 s: "
                           + (self.dir / "server.log").read_text()[-2000:])

    def sql(self, statement, database="postgres"):
        """Run one statement with psql; return its unaligned output."""
        out = subprocess.run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                              "-d", database, "-At", "-c", statement],
                             check=True, capture_output=True, text=True)
        return out.stdout.strip()

    def create_database(self, name):
        self.sql(f'CREATE DATABASE "{name}"')
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self):
        """Stop the server and wait until it is gone.

        The signal goes to the whole process group: as root the server runs under runuser,
        which does not pass SIGINT on, and a postgres left behind outlived the test run.
        """
        if self.proc and self.proc.poll() is None:
            self._signal_group(signal.SIGINT)  # fast shutdown: clients are cut off
            if not self._gone(10):
                self._signal_group(signal.SIGKILL)
                self._gone(10)
            self.proc.wait()
        self.proc = None

    def _signal_group(self, sig):
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass

    def _gone(self, seconds):
        """Wait until the server's pidfile is gone and runuser has exited; return whether it is."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.proc.poll() is not None and not (self.data / "postmaster.pid").exists():
                return True
            time.sleep(0.05)
        return False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv):
    """`python -m tests.harness.pg CMD...`: run CMD with LLMGW_TEST_POSTGRES pointing at a
    private server (fresh each run), or say why none can run and exit 0 without running it."""
    import sys
    import tempfile
    reason = missing_reason()
    if reason:
        print(f"PostgreSQL pass skipped: {reason}")
        return 0
    with tempfile.TemporaryDirectory(prefix="llmgw-pg-") as work, PostgresServer(Path(work)) as pg:
        env = dict(os.environ, LLMGW_TEST_POSTGRES=f"postgresql://postgres@127.0.0.1:{pg.port}")
        print(f"PostgreSQL {pg.sql('SHOW server_version')} on 127.0.0.1:{pg.port}", flush=True)
        sys.stdout.flush()
        return subprocess.run(argv, env=env).returncode


if __name__ == "__main__":
    import sys
    raise SystemExit(main(sys.argv[1:]))
