"""`flask llmgw …`: thin wrappers over services. Every command takes --root DIR."""
import asyncio
import functools
import json
from pathlib import Path

import click
from flask import current_app
from flask.cli import AppGroup, with_appcontext

from ..errors import LlmgwError

class _Commands(AppGroup):
    """The llmgw group. Its commands' modules, and the services they use (asyncssh among them),
    are imported when a command is first looked up: a web worker, which registers the group
    but runs no command, never imports them."""

    def _load(self):
        from . import cluster, demo, keys, limits, mirror, models, setup, status, users  # noqa: F401  (they add their commands)

    def get_command(self, ctx, name):
        self._load()
        return super().get_command(ctx, name)

    def list_commands(self, ctx):
        self._load()
        return super().list_commands(ctx)


llmgw = _Commands("llmgw", help="Manage an llmgw control plane.")


def root_option(f=None, *, creates=False):
    """Add --root DIR: read config, database and keys from DIR instead of /etc/llmgw.

    Commands other than those that create the control plane (creates=True) refuse to
    run against a database that does not exist yet.
    """
    if f is None:
        return functools.partial(root_option, creates=creates)

    @click.option("--root", "root", type=click.Path(file_okay=False), envvar="LLMGW_ROOT",
                  help="Keep config, database, keys and caches under this directory "
                       "(default: /etc/llmgw and /var/lib/llmgw). Also LLMGW_ROOT.")
    @with_appcontext
    @functools.wraps(f)
    def wrapper(*args, root=None, **kwargs):
        from .. import reconfigure
        from ..models import database
        if root:
            reconfigure(current_app, root)
        if creates:
            Path(current_app.config["LLMGW"]["_root"]).mkdir(parents=True, exist_ok=True, mode=0o700)
        else:
            _require_database(current_app.config["LLMGW"])
        try:
            database.connect(reuse_if_open=True)
            return f(*args, **kwargs)
        except LlmgwError as e:
            raise click.ClickException(str(e)) from e
        finally:
            if not database.is_closed():
                database.close()
    return wrapper


def _require_database(c):
    url = c["database"]["url"]
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists():
        raise click.ClickException(f"there is no llmgw database at {url[len('sqlite:///'):]}; "
                                   f"run `flask llmgw init` (with the same --root) first.")


def conf():
    return current_app.config["LLMGW"]


def run_async(coro):
    """Run a coroutine from a CLI command (the CLI is its own process, so asyncio.run is fine)."""
    return asyncio.run(coro)


def echo_json(obj):
    click.echo(json.dumps(obj, indent=2, default=str))


def table(rows, columns, empty):
    """Print rows under a header. columns: [(HEADER, function of a row)]; the last column is
    not padded. `empty` is printed instead when there are no rows: it says what would fill
    the list and how."""
    if not rows:
        click.echo(empty)
        return
    cells = [[h for h, _ in columns]] + [[_cell(get(r)) for _, get in columns] for r in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for line in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(line[:-1], widths)) + "  " + line[-1]
                   if len(line) > 1 else line[0])


def _cell(value):
    if value is None or value == "":
        return "-"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "-"
    if hasattr(value, "strftime"):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value)


def main():
    """The `llmgw` console script: `llmgw COMMAND …` is `flask --app llmgw:create_app llmgw
    COMMAND …`, from any directory."""
    from flask.cli import ScriptInfo
    from .. import create_app
    llmgw.main(prog_name="llmgw", obj=ScriptInfo(create_app=create_app))


def register(app):
    app.cli.add_command(llmgw)
