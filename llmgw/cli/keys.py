"""`flask llmgw keys create|list|revoke`."""
import click

from ..models import ApiKey, Project
from ..services import tenancy
from . import echo_json, llmgw, root_option


@llmgw.group("keys")
def keys():
    """API keys: made per project, shown once, stored as a hash."""


@keys.command("create")
@click.option("--project", default="default", show_default=True)
@click.option("--name", default="", help="A label to recognise the key by.")
@click.option("--models", default="", help="Comma-separated models the key may use (default: all).")
@click.option("--expires-days", type=click.IntRange(1), help="Stop working after this many days.")
@root_option
def create(project, name, models, expires_days):
    """Create an API key and print it (the only time it is shown)."""
    row, key = tenancy.create_key(project, name, models=[m for m in models.split(",") if m] or None,
                                  expires_days=expires_days)
    click.echo(key)
    click.echo(f"(key {row.prefix}… in project {project}; it is not shown again)", err=True)


@keys.command("list")
@click.option("--json", "as_json", is_flag=True)
@root_option
def list_keys(as_json):
    """List API keys (prefixes only)."""
    rows = [{"prefix": k.prefix, "project": k.project.name, "name": k.name, "created": k.created,
             "revoked": k.revoked} for k in ApiKey.select().join(Project).order_by(ApiKey.id)]
    if as_json:
        return echo_json(rows)
    for r in rows:
        state = "revoked" if r["revoked"] else "live"
        click.echo(f"{r['prefix']}…  {r['project']:<16} {state:<8} {r['name']}")


@keys.command("revoke")
@click.argument("key")
@root_option
def revoke(key):
    """Revoke a key: the whole key, or its start as `keys list` shows it (any unique part of
    that start will do)."""
    row = tenancy.revoke_key(key)
    click.echo(f"revoked {row.prefix}… (project {row.project.name})")
