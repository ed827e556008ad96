"""Every configuration key and every command is documented in docs/reference.md."""
from pathlib import Path

from llmgw import config
from llmgw.cli import llmgw

REFERENCE = (Path(__file__).resolve().parent.parent / "docs" / "reference.md").read_text()


def test_every_config_key_is_documented():
    missing = [f"{s}.{k}" for s, keys in config.DEFAULTS.items() for k in keys
               if f"`{s}.{k}`" not in REFERENCE]
    assert missing == []


def test_every_command_is_documented(app):
    import click
    ctx = click.Context(llmgw)
    names = []
    for name in llmgw.list_commands(ctx):  # the commands are loaded when first listed
        subs = getattr(llmgw.get_command(ctx, name), "commands", None)
        names += [f"{name} {s}" for s in subs] if subs else [name]
    assert len(names) > 30
    missing = [n for n in names if f"`{n}" not in REFERENCE]
    assert missing == []


def test_every_metric_is_documented_and_the_dashboard_asks_only_for_those():
    import json
    import re
    from llmgw import metrics
    from llmgw.services import cluster_metrics
    made = {f.name + ("_total" if f.kind == "Counter" else "") for f in vars(metrics).values()
            if isinstance(f, metrics._Family)}
    made |= {fam.name for fam in cluster_metrics.families([], {}, {}, {})}
    documented = set(re.findall(r"`(llmgw_[a-z_]+)`", REFERENCE.split("## Metrics")[1].split("\n## ")[0]))
    assert made and made == documented
    dashboard = json.loads((Path(__file__).resolve().parent.parent / "deploy" / "grafana-dashboard.json").read_text())
    asked = {re.sub(r"_(bucket|count|sum)$", "", name) for panel in dashboard["panels"]
             for target in panel["targets"] for name in re.findall(r"llmgw_[a-z_]+", target["expr"])}
    assert asked <= made, asked - made
