"""`flask llmgw mirror fetch | list | remove`: the control plane's cache as the fleet's mirror."""
import sys

import click

from ..errors import LlmgwError
from ..services import mirror
from ..plans.sizing import human_bytes
from . import conf, echo_json, llmgw, root_option, table


@llmgw.group("mirror")
def mirror_group():
    """Files fetched once into the control plane's cache, for models to use as mirror:NAME."""


@mirror_group.command("fetch")
@click.argument("url")
@click.option("--name", default="", help="The entry's name (default: the URL's file name).")
@click.option("--sha256", default="", help="The file's checksum: a file that does not match is deleted.")
@root_option
def mirror_fetch(url, name, sha256):
    """Fetch URL into the mirror with a progress bar; a fetch cut short continues."""
    bar = {"bar": None, "at": 0}

    def progress(done, total):
        if bar["bar"] is None:
            bar["bar"] = click.progressbar(length=total or None, label=name or url.rsplit("/", 1)[-1],
                                           show_pos=True, file=sys.stderr)
            bar["bar"].__enter__()
            bar["bar"].update(done)
            bar["at"] = done
        elif done > bar["at"]:
            bar["bar"].update(done - bar["at"])
            bar["at"] = done

    def said(text):
        if bar["bar"] is not None:
            bar["bar"].__exit__(None, None, None)
            bar["bar"] = None
        click.echo(text, err=True)
    try:
        info = mirror.fetch(conf(), url, name, sha256, progress, said)
    finally:
        if bar["bar"] is not None:
            bar["bar"].__exit__(None, None, None)
    if info.get("already"):
        click.echo(f"{info['name']} is mirrored already ({human_bytes(info['bytes'])}, sha256 "
                   f"{info['sha256']}); use it as --file mirror:{info['name']}")
        return
    click.echo(f"mirrored {info['name']}: {human_bytes(info['bytes'])}, sha256 {info['sha256']} "
               f"(verified{' against --sha256' if sha256 else ', recorded'}); use it as "
               f"--file mirror:{info['name']}")


@mirror_group.command("list")
@click.option("--json", "as_json", is_flag=True)
@root_option
def mirror_list(as_json):
    """List what the mirror holds: size, checksum, source URL, the models that use it."""
    rows = mirror.entries(conf())
    if as_json:
        return echo_json(rows)
    table(rows, [("NAME", lambda r: r["name"]), ("SIZE", lambda r: human_bytes(r["bytes"])),
                 ("STATE", lambda r: r["state"]), ("SHA256", lambda r: (r["sha256"] or "")[:12]),
                 ("USED BY", lambda r: r["in_use_by"] or "no model"), ("URL", lambda r: r["url"])],
          "the mirror is empty; `llmgw mirror fetch URL` adds to it")


@mirror_group.command("remove")
@click.argument("name")
@root_option
def mirror_remove(name):
    """Delete an entry from the mirror; refused while a model uses it."""
    try:
        click.echo(mirror.remove(conf(), name))
    except OSError as e:
        raise LlmgwError(f"removing {name} failed: {e}") from e
