"""`flask llmgw demo`: a working gateway on this machine, no GPU, no root, no network."""
import os
from pathlib import Path

import click
from click.core import ParameterSource
from flask import current_app

from .. import config, reconfigure, secrets_box, security
from ..errors import LlmgwError
from ..models import Model, User
from ..services import nodes, tenancy
from . import conf, llmgw, root_option, run_async
from .setup import init_steps, refuse_busy, serve

# What a rerun needs to print the same lines: the demo's key and the administrator's password,
# sealed with the control plane's secrets key (<root>/secrets/fernet.key), readable by root only.
KEEP = "demo.sealed"


@llmgw.command("demo")
@click.option("--admin", default="admin@localhost", show_default=True)
@click.option("--listen", default="127.0.0.1:8080", show_default=True,
              help="Where to serve; given on a rerun, it wins over server.listen in server.toml.")
@click.option("--no-serve", is_flag=True, help="Set everything up, print the lines, and exit.")
@root_option(creates=True)
@click.pass_context
def demo(ctx, admin, listen, no_serve):
    """Set up a demo cluster: this machine as a local node running a simulated engine."""
    c = conf()
    given = ctx.get_parameter_source("listen") != ParameterSource.DEFAULT
    if Path(c["_path"]).exists() and given and listen != c["server"]["listen"]:
        # The file is the operator's; an address given now is used for this run only.
        os.environ["LLMGW_SERVER_LISTEN"] = listen
        c = reconfigure(current_app, None if c["_path"] == str(config.SYSTEM_CONFIG) else c["_root"])
    if not no_serve:  # before anything is set up or printed
        if Path(c["_path"]).exists():
            setting = "--listen" if given else f"server.listen in {c['_path']} (or --listen)"
            refuse_busy(c["server"]["listen"], setting)
        else:
            refuse_busy(listen, "--listen")
    click.echo("llmgw demo:")
    # No llama.cpp download without a network: the demo's engine is the built-in simulator.
    made_password = init_steps(admin, listen, llamacpp="")
    c = conf()
    root = Path(c["_root"])
    node = run_async(nodes.add_local_node("local", str(root / "node")))
    click.echo(f"  {'node':<22} {node.name} (this machine, local transport)")
    if not Model.get_or_none(Model.name == "demo"):
        Model.create(name="demo", engine="sim", source="", sha256="", replicas=1, args=[])
    click.echo(f"  {'model':<22} demo (simulated engine, 1 replica)")
    kept = _kept(root)
    key, key_said = _key(kept)
    password, password_said = _password(admin, made_password, kept)
    # A password changed since (not shown) keeps the one the demo set, so the next run still
    # sees it was changed and leaves it alone.
    _keep(root, {"key": key, "password": password or kept.get("password")})
    click.echo(f"  {'api key':<22} {key_said}")
    click.echo(f"  {'admin password':<22} {password_said}")
    url = c["server"]["public_url"]
    login = f"with password {password}" if password else "with the password you set"
    click.echo(f"""
export OPENAI_BASE_URL={url}/v1
export OPENAI_API_KEY={key}

Admin page: {url}/  log in as {admin} {login}
The first replica takes a few seconds to start once the server is up; then try:
  curl -s $OPENAI_BASE_URL/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" \\
    -H 'Content-Type: application/json' -d '{{"model":"demo","messages":[{{"role":"user","content":"hi"}}]}}'
""")
    if no_serve:
        return
    click.echo("Ctrl-C stops the demo and the engines it started.")
    try:
        ctx.invoke(serve)
    finally:
        _stop_engines(c, node)


def _kept(root):
    path = root / KEEP
    if not path.exists():
        return {}
    import json
    try:
        return json.loads(secrets_box.unseal(root, path.read_text().strip(), f"the demo's {path}"))
    except (secrets_box.Unreadable, ValueError):
        return {}  # made again below, and said so


def _keep(root, values):
    import json
    path = root / KEEP
    path.write_text(secrets_box.seal(root, json.dumps(values)) + "\n")
    path.chmod(0o600)


def _key(kept):
    """Return (the demo's key, what to say of it): the one from the last run while it works."""
    old = kept.get("key")
    if old and tenancy.lookup_key(old) is not None:
        return old, f"kept {security.display_prefix(old)}… from the last run"
    _, key = tenancy.create_key("default", "demo")
    why = "made " + security.display_prefix(key) + "…"
    return key, why + (" (the last run's key no longer works)" if old else "")


def _password(admin, made, kept):
    """Return (the administrator's password or None, what to say of it). A rerun keeps it; one
    changed since (on the profile page) is left alone and not shown."""
    user = User.get(User.email == admin)
    if made:
        return made, "made (printed below)"
    old = kept.get("password")
    if old and security.check_password(user.password_hash, old):
        return old, "kept from the last run (printed below)"
    if old:
        return None, (f"kept as it is (changed since the demo set it; `llmgw users reset-password "
                      f"{admin}` makes a new one)")
    # An earlier run left nothing this one can read (a demo from before it kept them, or a
    # secrets key replaced): without a new one nobody could log in.
    password = security.generate_password()
    user.password_hash = security.hash_password(password)
    user.save()
    return password, "reset: no password from an earlier run could be read (printed below)"


def _stop_engines(c, node):
    try:
        stopped = run_async(nodes.stop_engines(c, node))
    except (LlmgwError, OSError) as e:
        click.echo(f"the demo's engines could not be stopped: {e}", err=True)
        return
    if stopped:
        click.echo(f"stopped {', '.join('llmgw-' + u for u in sorted(stopped))}")
