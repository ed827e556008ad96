"""`flask llmgw init | serve | reconcile | demo`: set up and run a control plane."""
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import requests
from flask import current_app

from .. import TOP, config, migrate, reconfigure
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
        path.write_text(config.render_initial(listen, secrets.token_urlsafe(32), llamacpp))
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
    from .. import reconciler
    import logging
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    migrate.upgrade(database.obj)
    database.close()
    reconciler.main(conf(), once=once)


def gunicorn_argv(c):
    return [sys.executable, "-m", "gunicorn", "-c", str(TOP / "deploy" / "gunicorn.conf.py"),
            "--bind", c["server"]["listen"], "--workers", str(c["server"]["workers"]),
            "llmgw:create_app()"]


@llmgw.command("serve")
@root_option
def serve():
    """Run the web server (gunicorn, gevent workers) and the reconciler side by side."""
    c = conf()
    migrate.upgrade(database.obj)
    database.close()
    env = dict(os.environ, LLMGW_ROOT=c["_root"]) if c["_path"] != str(config.SYSTEM_CONFIG) else dict(os.environ)
    children = [subprocess.Popen(gunicorn_argv(c), env=env),
                subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app",
                                  "llmgw", "reconcile"], env=env)]
    click.echo(f"llmgw serving on {c['server']['public_url']} (pids {children[0].pid}, {children[1].pid})")

    def stop(*_):
        for p in children:
            if p.poll() is None:
                p.terminate()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while all(p.poll() is None for p in children):
            time.sleep(0.5)
    finally:
        stop()
        for p in children:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    failed = [p for p in children if p.returncode not in (0, -signal.SIGTERM, None)]
    if failed:
        raise click.ClickException("a child process exited with status "
                                   + ", ".join(str(p.returncode) for p in failed))

