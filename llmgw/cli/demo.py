"""`flask llmgw demo`: a working gateway on this machine, no GPU, no root, no network."""
from pathlib import Path

import click

from .. import security
from ..models import Model, User
from ..services import nodes, tenancy
from . import conf, llmgw, root_option, run_async
from .setup import init_steps, refuse_busy, serve


@llmgw.command("demo")
@click.option("--admin", default="admin@localhost", show_default=True)
@click.option("--listen", default="127.0.0.1:8080", show_default=True)
@click.option("--no-serve", is_flag=True, help="Set everything up, print the lines, and exit.")
@root_option(creates=True)
@click.pass_context
def demo(ctx, admin, listen, no_serve):
    """Set up a demo cluster: this machine as a local node running a simulated engine."""
    if not no_serve:  # before anything is set up or printed
        c = conf()
        if Path(c["_path"]).exists():
            refuse_busy(c["server"]["listen"], f"server.listen in {c['_path']}")
        else:
            refuse_busy(listen, "--listen")
    click.echo("llmgw demo:")
    # No llama.cpp download without a network: the demo's engine is the built-in simulator.
    init_steps(admin, listen, llamacpp="")
    c = conf()
    node = run_async(nodes.add_local_node("local", str(Path(c["_root"]) / "node")))
    click.echo(f"  {'node':<22} {node.name} (this machine, local transport)")
    if not Model.get_or_none(Model.name == "demo"):
        Model.create(name="demo", engine="sim", source="", sha256="", replicas=1, args=[])
    click.echo(f"  {'model':<22} demo (simulated engine, 1 replica)")
    _, key = tenancy.create_key("default", "demo")
    user = User.get(User.email == admin)
    password = security.generate_password()
    user.password_hash = security.hash_password(password)
    user.save()
    url = c["server"]["public_url"]
    click.echo(f"""
export OPENAI_BASE_URL={url}/v1
export OPENAI_API_KEY={key}

Admin page: {url}/  log in as {admin} with password {password}
The replica starts within a few seconds of the server; then try:
  curl -s $OPENAI_BASE_URL/chat/completions -H "Authorization: Bearer $OPENAI_API_KEY" \\
    -H 'Content-Type: application/json' -d '{{"model":"demo","messages":[{{"role":"user","content":"hi"}}]}}'
""")
    if not no_serve:
        ctx.invoke(serve)
