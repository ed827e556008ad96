"""`llmgw status` (the cluster on one screen) and `llmgw replicas`."""
import click

from ..models import Model, Node, Replica
from ..services.model_views import replica_view
from ..services.overview import overview
from . import conf, echo_json, llmgw, root_option, table


@llmgw.command("status")
@click.option("--json", "as_json", is_flag=True)
@root_option
def status(as_json):
    """The cluster on one screen: nodes by state, GPUs, models, replicas, what needs doing."""
    o = overview(conf())
    if as_json:
        return echo_json(o)
    n, g, r = o["nodes"], o["gpus"], o["replicas"]
    states = ", ".join(f"{k} {v}" for k, v in n["by_state"].items())
    click.echo(f"{'nodes':<10} {n['total']}" + (f" ({states})" if states else
                                                "; add one with `llmgw add-node NAME --addr HOST`"))
    classes = ", ".join(f"{c} {v['free']}/{v['total']}" for c, v in g["by_class"].items())
    click.echo(f"{'gpus':<10} {g['free']} free of {g['total']}" + (f" ({classes})" if classes else "")
               + (f"; {g['total'] - g['healthy']} unhealthy" if g["total"] > g["healthy"] else ""))
    click.echo(f"{'models':<10} {len(o['models'])}" + ("".join(
        f"\n  {m['name']:<24} {m['ready']}/{m['wanted']} ready" for m in o["models"]) if o["models"]
        else "; add one with `llmgw model add NAME --file PATH`"))
    others = ", ".join(f"{k} {v}" for k, v in r["by_state"].items() if k != "ready")
    click.echo(f"{'replicas':<10} {r['ready']} of {r['total']} ready" + (f" ({others})" if others else ""))
    if o["endpoints"]:
        click.echo(f"{'endpoints':<10} " + ", ".join(f"{e['name']} {e['state']}" for e in o["endpoints"]))
    click.echo(f"{'requests':<10} {o['requests_per_second']:g}/s over the last minute")
    if o["warnings"]:
        click.echo(f"\n{len(o['warnings'])} warning(s):")
        for w in o["warnings"]:
            click.echo(f"  - {w}")
    else:
        click.echo("\nno warnings")


@llmgw.command("replicas")
@click.option("--model", "model_name", default="", help="Only this model's replicas.")
@click.option("--node", "node_name", default="", help="Only the replicas on this node.")
@click.option("--json", "as_json", is_flag=True)
@root_option
def replicas(model_name, node_name, as_json):
    """List replicas: model, node, state, port, GPUs, and what each is doing."""
    query = Replica.select(Replica, Model, Node).join(Model).switch(Replica).join(Node)
    if model_name:
        if not Model.get_or_none(Model.name == model_name):
            raise click.ClickException(f"no model called {model_name!r}; `llmgw models` lists them.")
        query = query.where(Model.name == model_name)
    if node_name:
        if not Node.get_or_none(Node.name == node_name):
            raise click.ClickException(f"no node called {node_name!r}; `llmgw nodes` lists them.")
        query = query.where(Node.name == node_name)
    rows = [replica_view(r) for r in query.order_by(Model.name, Replica.name)]
    if as_json:
        return echo_json(rows)
    table(rows, [("REPLICA", lambda r: r["name"]), ("MODEL", lambda r: r["model"]),
                 ("NODE", lambda r: r["node"]), ("STATE", lambda r: r["state"]),
                 ("PORT", lambda r: r["port"]), ("GPUS", lambda r: r["gpu_indexes"]),
                 ("DETAIL", lambda r: r["progress_text"] or r["detail"])],
          "no replicas" + (" match" if model_name or node_name else
                           " yet: a model's replicas are placed by the reconciler (`llmgw models`)"))
