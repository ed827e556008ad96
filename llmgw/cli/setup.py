"""`flask llmgw init | serve | reconcile | demo`: set up and run a control plane."""
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import click
import requests
from flask import current_app

from .. import TOP, config, migrate, reconfigure, secrets_box
from ..executors import ssh
from ..models import database
from ..services import tenancy
from . import conf, llmgw, root_option

UNITS = ("llmgw-web.service", "llmgw-reconciler.service")


def step(name, outcome):
    click.echo(f"  {name:<22} {outcome}")


def init_steps(admin, listen, llamacpp=config.DEFAULT_LLAMACPP):
    """Do every init step that is not done yet; return the admin password if one was made."""
    c = conf()
    root = Path(c["_root"])
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = Path(c["_path"])
    if path.exists():
        step("config", f"kept {path}")
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(config.render_initial(listen, secrets.token_urlsafe(32), llamacpp,
                                               metrics_token=secrets.token_urlsafe(24)))
        path.chmod(0o600)
        step("config", f"wrote {path}")
        c = reconfigure(current_app, None if path.parent == config.SYSTEM_CONFIG.parent else str(root))
        database.connect(reuse_if_open=True)
    key = Path(c["ssh"]["key"])
    if key.exists():
        step("ssh identity", f"kept {key}")
    else:
        key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        ssh.generate_identity(key)
        step("ssh identity", f"made {key} ({ssh.fingerprint(ssh.public_key_line(key))})")
    made = secrets_box.ensure(root)
    step("secrets key", f"{'made' if made else 'kept'} {secrets_box.key_path(root)}")
    ran = migrate.upgrade(database.obj)
    step("database", f"migrated ({', '.join(ran)})" if ran else "kept (schema up to date)")
    _, created = tenancy.ensure_default_project()
    step("default project", "created default org/team/project" if created else "kept")
    user, password = tenancy.ensure_admin(admin)
    step("administrator", f"created {user.email}" if password else f"kept {user.email}")
    return password


@llmgw.command("init")
@click.option("--admin", default="admin@localhost", show_default=True,
              help="Email of the first administrator.")
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="Address the web server listens on (written to a new config only).")
@root_option(creates=True)
def init(admin, listen):
    """Set up a control plane: config, SSH identity, database, default project, administrator."""
    click.echo("llmgw init:")
    password = init_steps(admin, listen)
    if password:
        click.echo(f"\nAdministrator {admin}, password: {password}\n(shown once; it is stored only as a hash)")
    _service_step()


def _service_step():
    c = conf()
    systemd = Path("/run/systemd/system").is_dir() and os.geteuid() == 0
    if systemd and c["_path"] == str(config.SYSTEM_CONFIG):
        installed = _install_units()
        step("service", installed)
        _wait_health(c["server"]["public_url"])
        return
    root = c["_root"]
    step("service", "not installed (" + ("not root on a systemd machine" if not systemd
                                          else "--root install") + ")")
    click.echo(f"\nStart it with:  flask llmgw serve --root {root}")


def _install_units():
    changed = []
    for unit in UNITS:
        target = Path("/etc/systemd/system") / unit
        text = (TOP / "deploy" / unit).read_text().replace("@PYTHON@", sys.executable) \
            .replace("@TOP@", str(TOP))
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            changed.append(unit)
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    subprocess.run(["systemctl", "enable", "--now", *UNITS], check=True)
    return f"installed and started {', '.join(changed)}" if changed else "kept units; started"


def _wait_health(url, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                step("health", f"{url}/health answers")
                return True
        except requests.RequestException:
            pass
        time.sleep(0.5)
    raise click.ClickException(f"{url}/health did not answer within {timeout} s; "
                               f"see `journalctl -u llmgw-web`.")


@llmgw.command("reconcile")
@click.option("--once", is_flag=True, help="Do two passes and exit instead of running forever.")
@root_option
def reconcile(once):
    """Run the reconciler: converge every node on the wanted state."""
    from .. import metrics
    metrics.start_process(conf(), "reconciler")  # before prometheus_client is imported
    from .. import reconciler
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    migrate.upgrade(database.obj)
    database.close()
    reconciler.main(conf(), once=once)


def refuse_busy(listen, setting, tries=10):
    """Stop with one line when something already listens on HOST:PORT: gunicorn would fail
    there after everything else had started. Like gunicorn, it gives a process that is just
    going away (a server restarted) a few seconds to let go of it."""
    host, _, port = listen.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for attempt in range(tries):
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn binds
            try:
                s.bind((host, int(port)))
                return
            except OSError as e:
                if attempt + 1 == tries:
                    raise click.ClickException(
                        f"{listen} cannot be listened on ({e.strerror}); something else has it: "
                        f"stop it, or give another address with {setting}") from None
        time.sleep(0.5)


def gunicorn_argv(c):
    return [sys.executable, "-m", "gunicorn", "-c", str(TOP / "deploy" / "gunicorn.conf.py"),
            "--bind", c["server"]["listen"], "--workers", str(c["server"]["workers"]),
            "llmgw:create_app()"]


# A reconciler that dies under `serve` is started again after 1 s, doubling to a minute while it
# keeps dying within a minute of its start; the gateway serves throughout.
RESTART_FIRST, RESTART_MAX, RESTART_RESET = 1, 60, 60


def restart_delay(restarts):
    """Seconds to wait before starting the reconciler again after `restarts` quick deaths."""
    return min(RESTART_FIRST * 2 ** max(restarts - 1, 0), RESTART_MAX)


@llmgw.command("serve")
@root_option
def serve():
    """Run the web server (gunicorn, gevent workers) and the reconciler side by side."""
    c = conf()
    refuse_busy(c["server"]["listen"], f"server.listen in {c['_path']}")
    migrate.upgrade(database.obj)
    database.close()
    env = dict(os.environ, LLMGW_ROOT=c["_root"]) if c["_path"] != str(config.SYSTEM_CONFIG) else dict(os.environ)
    web = subprocess.Popen(gunicorn_argv(c), env=env)
    reconciler = _Reconciler(env)
    click.echo(f"llmgw serving on {c['server']['public_url']} (pids {web.pid}, {reconciler.proc.pid})")
    stopping = []

    def stop(*_):
        stopping.append(True)
        for p in (web, reconciler.proc):
            if p.poll() is None:
                p.terminate()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopping and web.poll() is None:
            reconciler.keep_running(stopping)
            time.sleep(0.5)
    finally:
        stop()
        for p in (web, reconciler.proc):
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    if web.returncode not in (0, -signal.SIGTERM, None):
        raise click.ClickException(f"the web server (gunicorn) exited with status {web.returncode}")


class _Reconciler:
    """The reconciler child of `serve`, started again when it dies."""

    def __init__(self, env):
        self.env, self.restarts = env, 0
        self._start()

    def _start(self):
        self.proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app",
                                      "llmgw", "reconcile"], env=self.env)
        self.started = time.monotonic()

    def keep_running(self, stopping):
        """Start the reconciler again, after a pause, if it has exited on its own."""
        if self.proc.poll() is None:
            return
        ran = time.monotonic() - self.started
        self.restarts = 1 if ran > RESTART_RESET else self.restarts + 1
        delay = restart_delay(self.restarts)
        click.echo(f"the reconciler (pid {self.proc.pid}) exited with status {self.proc.returncode} "
                   f"after {ran:.0f} s; starting it again in {delay} s; the gateway keeps serving",
                   err=True)
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if not stopping:
            self._start()


