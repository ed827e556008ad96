"""`flask llmgw model add | set | remove | show | plan`, `models` and `explain`."""
import click

from ..errors import LlmgwError
from ..models import Model
from ..plans import modelspec
from ..plans.modelspec import ModelSpec, SpecError
from ..services import catalog, model_removal, placing
from ..services.model_views import model_view, needs_text
from . import conf, echo_json, llmgw, root_option, run_async


def _options(for_set):
    """The flags `model add` and `model set` share; for set, every one defaults to "unchanged"."""
    def d(value):
        return None if for_set else value
    opts = [
        click.option("--file", "source", default=d(""),
                     help="A GGUF file on this machine or an http(s) URL (llamacpp); a directory "
                          "with config.json and *.safetensors (vllm, sglang), copied to the nodes "
                          "as a tree checked file by file."),
        click.option("--node-path", "node_path", default=d(""),
                     help="Weights already on the nodes at this absolute path (shared storage, "
                          "pre-staged disks): used in place, never copied, never deleted."),
        click.option("--on-nodes/--not-on-nodes", "on_nodes", default=d(False),
                     help="--file is a path already present on the nodes (as --node-path)."),
        click.option("--engine", default=d("llamacpp"), show_default=not for_set,
                     type=click.Choice(modelspec.ENGINES)),
        click.option("--replicas", type=int, default=d(1), show_default=not for_set,
                     help=f"0 to {modelspec.MAX_REPLICAS}."),
        click.option("--sha256", default=d(""), help="The file's checksum, when known (a URL is checked against it)."),
        click.option("--arg", "args", multiple=True, help="An extra engine argument (repeatable), e.g. --arg=-t --arg=1."),
        click.option("--fallback", "fallbacks", multiple=True,
                     help="A model to serve requests when this one has no ready replica (repeatable, in order)."),
        click.option("--gpus", type=int, default=d(0), help="Whole cards per replica; 0: a CPU model."),
        click.option("--gpu-class", "gpu_class", default=d(""),
                     help="Allowed classes, comma-separated, as discovery names them (h100-80g,a100-80g)."),
        click.option("--min-gpu-memory", default=d(""), help="Memory every claimed card has, e.g. 40G."),
        click.option("--memory", default=d(""), help="Host RAM per replica, e.g. 12G (estimated when left out)."),
        click.option("--context", type=int, default=d(0), help="The engine's context size in tokens (0: the model's own)."),
        click.option("--require", "requires", multiple=True, help="A node label KEY=VALUE the node must carry (repeatable)."),
        click.option("--max-per-node", type=int, default=d(0),
                     help="At most this many replicas of the model on one node (0: spread, stack only when needed)."),
        click.option("--share-gpu/--no-share-gpu", "share_gpu", default=d(False),
                     help="Replicas take memory on one shared card (--min-gpu-memory, else the estimate) instead of whole cards."),
    ]
    if for_set:
        opts += [click.option("--no-args", is_flag=True, help="Remove every extra engine argument."),
                 click.option("--no-fallbacks", is_flag=True, help="Remove every fallback."),
                 click.option("--no-require", is_flag=True, help="Remove every label requirement.")]

    def apply(f):
        for opt in reversed(opts):
            f = opt(f)
        return f
    return apply


@llmgw.group("model")
def model():
    """The model catalog: what each model serves from and what it needs."""


@model.command("add")
@click.argument("name")
@_options(for_set=False)
@root_option
def model_add(name, **given):
    """Add a model (or replace all of one's settings); the reconciler places its replicas."""
    try:
        spec = ModelSpec(name=name, **modelspec.changes_from_flags(given, for_set=False))
    except SpecError as e:
        raise LlmgwError(str(e)) from e
    row, created, warnings = catalog.add(spec, conf())
    click.echo(f"{'added' if created else 'updated'} model {row.name}: {needs_text(row)}")
    _after_change(row, warnings)


@model.command("set")
@click.argument("name")
@_options(for_set=True)
@root_option
def model_set(name, no_args, no_fallbacks, no_require, **given):
    """Change only the settings given; the others stay as they are."""
    clash = [f for f, given_too in (("--no-args", no_args and given["args"]),
                                    ("--no-fallbacks", no_fallbacks and given["fallbacks"]),
                                    ("--no-require", no_require and given["requires"])) if given_too]
    if clash:
        raise LlmgwError(f"{clash[0]} removes what the same command also sets; give one of the two.")
    try:
        changes = modelspec.changes_from_flags(given, for_set=True)
    except SpecError as e:
        raise LlmgwError(str(e)) from e
    changes.update({k: v for k, v in (("args", ()), ("fallbacks", ()), ("requires", {}))
                    if {"args": no_args, "fallbacks": no_fallbacks, "requires": no_require}[k]})
    if not changes:
        raise LlmgwError(f"nothing to change: give the settings to change, e.g. "
                         f"`flask llmgw model set {name} --replicas 2`.")
    row, warnings = catalog.change(name, conf(), **changes)
    click.echo(f"changed model {row.name} ({', '.join(sorted(changes))}): {needs_text(row)}")
    _after_change(row, warnings)


def _after_change(row, warnings):
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    lines, result = placing.explain(row)
    click.echo(f"placement as the cluster stands: {result.verdicts[row.name]['summary']}")


@model.command("remove")
@click.argument("name")
@click.option("--force", is_flag=True, help="Remove it even while other models name it as a fallback.")
@click.option("--now", is_flag=True, help="Stop its engines at once, without waiting for their requests.")
@root_option
def model_remove(name, force, now):
    """Take a model's replicas out of routing, stop them once their requests are done, forget it."""
    stopped, left = run_async(model_removal.remove(conf(), name, force, lambda t: click.echo(t, err=True), now))
    click.echo(f"removed model {name}" + (f"; stopped {', '.join(stopped)}" if stopped else "; no replica was running"))
    for line in left:
        click.echo(f"warning: {line}", err=True)


@llmgw.command("models")
@click.option("--json", "as_json", is_flag=True)
@root_option
def list_models(as_json):
    """List the catalog: each model's needs, replicas ready and placement."""
    rows = [model_view(m) for m in Model.select().order_by(Model.name)]
    if as_json:
        return echo_json(rows)
    if not rows:
        click.echo("no models yet; add one with `flask llmgw model add NAME --file PATH`.")
        return
    click.echo(f"{'MODEL':<20} {'READY':<7} {'FROM':<5} NEEDS / PLACEMENT")
    for r in rows:
        click.echo(f"{r['name']:<20} {r['ready']}/{r['replicas']:<5} {r['origin']:<5} {r['needs']}")
        click.echo(f"{'':<34}{r['placement']}")


@model.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@root_option
def model_show(name, as_json):
    """Show one model: settings, size estimate, replicas with their cards, placement."""
    view = model_view(catalog.get(name))
    if as_json:
        return echo_json(view)
    for key in ("engine", "source", "origin", "needs", "context", "args", "fallbacks", "placement"):
        click.echo(f"{key:<12} {view[key]}")
    est = view["estimate"]
    click.echo(f"{'estimate':<12} " + (f"{est['gpu_bytes'] / 1e9:.1f} GB on GPUs, "
                                       f"{est['host_bytes'] / 1e9:.1f} GB host RAM at {est['context']} tokens"
                                       if est else "none (its files are not on this machine)"))
    _echo_replicas(view["replica_rows"])


def _echo_replicas(reps):
    if not reps:
        click.echo("replicas     none placed")
    for r in reps:
        cards = (f"GPU {','.join(map(str, r['gpu_indexes']))} ({', '.join(r['gpu_uuids'])})"
                 if r["gpu_uuids"] else "no GPU")
        click.echo(f"replica      {r['name']} on {r['node']}:{r['port']} {cards}: {r['state']}  {r['detail']}")
        if r["progress_text"]:
            click.echo(f"             {r['progress_text']}")


@model.command("plan")
@click.argument("name", required=False)
@click.option("--file", "path", default="", help="Size a GGUF file or a safetensors directory here instead.")
@click.option("--context", type=click.IntRange(0, modelspec.MAX_CONTEXT), default=0,
              help="Tokens of context to size the KV cache for (default: the model's own).")
@root_option
def model_plan(name, path, context):
    """Print what one replica needs (weights, KV cache) and which GPU classes here can hold it."""
    from ..facts import model_meta
    from ..plans import sizing
    if bool(name) == bool(path):
        raise LlmgwError("give a model NAME from the catalog or --file PATH, one of the two.")
    gpus = 1
    if name:
        m = catalog.get(name)
        path, context, gpus = m.source, context or m.context, max(m.gpus, 1)
        if not m.source:
            raise LlmgwError(f"{name} runs the {m.engine} engine, which has no model file to size.")
        if catalog.local_path(catalog.spec_of(m)) is None:
            raise LlmgwError(f"{name}'s files ({m.source}) are not on this machine, so they cannot "
                             f"be read; give --file with a local copy.")
    meta = model_meta.read_model(path)
    est = sizing.estimate(meta, context, gpus)
    classes = [{"class": c, **v} for c, v in sorted(catalog.cluster_classes().items())]
    for line in sizing.describe(meta, est, sizing.fits_by_class(est["gpu_bytes"], classes)):
        click.echo(line)


@llmgw.command("explain")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True)
@root_option
def explain(name, as_json):
    """Say where a model's replicas run and, node by node, why one could or could not take one."""
    m = catalog.get(name)
    lines, result = placing.explain(m)
    view = {"model": m.name, "needs": needs_text(m), "summary": result.verdicts[m.name]["summary"],
            "replicas": model_view(m)["replica_rows"],
            "nodes": [{k: line[k] for k in ("node", "ok", "reason")} for line in lines]}
    if as_json:
        return echo_json(view)
    click.echo(f"{m.name}: {view['needs']}")
    click.echo(f"placement: {view['summary']}")
    _echo_replicas(view["replicas"])
    for line in view["nodes"]:
        click.echo(f"  {line['node']:<16} {'yes' if line['ok'] else 'no ':<4} {line['reason']}")
