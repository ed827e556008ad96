"""`flask llmgw keys create|list|revoke`."""
import click

from ..services import tenancy
from . import echo_json, llmgw, root_option, table


@llmgw.group("keys")
def keys():
    """API keys: made per project, shown once, stored as a hash."""


@keys.command("create")
@click.option("--project", default="default", show_default=True)
@click.option("--name", default="", help="A label to recognise the key by.")
@click.option("--models", default="", help="Comma-separated models the key may use (default: all).")
@click.option("--expires-days", type=click.IntRange(1, tenancy.MAX_KEY_DAYS), help="Stop working after this many days.")
@root_option
def create(project, name, models, expires_days):
    """Create an API key and print it (the only time it is shown)."""
    row, key = tenancy.create_key(project, name, models=[m for m in models.split(",") if m] or None,
                                  expires_days=expires_days)
    click.echo(key)
    click.echo(f"(key {row.prefix}… in project {project}; it is not shown again)", err=True)


@keys.command("list")
@click.option("--project", default="", help="Only this project's keys.")
@click.option("--json", "as_json", is_flag=True)
@root_option
def list_keys(project, as_json):
    """List API keys (their starts only): project, models, expiry, last use, state."""
    rows = tenancy.key_views(project or None)
    if as_json:
        return echo_json(rows)
    table(rows, [("KEY", lambda r: r["prefix"] + "…"), ("PROJECT", lambda r: r["project"]),
                 ("NAME", lambda r: r["name"]), ("MODELS", lambda r: r["models"] or "all"),
                 ("EXPIRES", lambda r: r["expires"] or "never"), ("LAST USED", lambda r: r["last_used"] or "never"),
                 ("STATE", lambda r: r["state"])],
          "no keys" + (f" in project {project}" if project else "") + ": `llmgw keys create --project P`")


@keys.command("revoke")
@click.argument("key")
@root_option
def revoke(key):
    """Revoke a key: the whole key, or its start as `keys list` shows it (any unique part of
    that start will do)."""
    row = tenancy.revoke_key(key)
    click.echo(f"revoked {row.prefix}… (project {row.project.name})")
