"""The models page (the catalog, with forms to add, change, scale and remove, as the CLI can)
and a model's page: what it needs, where its replicas run, and every node's verdict."""
import functools
from pathlib import Path

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for

from ..errors import LlmgwError
from ..green import off_the_hub
from ..models import Model
from ..plans import modelspec, sizing
from ..services import catalog, model_removal, placing
from ..services.model_views import model_view
from . import admin_required

bp = Blueprint("models", __name__)
# The form's fields, named as `model add`'s flags are; text fields left empty are "not given".
TEXT = ("source", "node_path", "engine", "sha256", "gpu_class", "min_gpu_memory", "memory")
NUMBERS = ("replicas", "gpus", "context", "max_per_node")


def _given(form, for_set):
    """The settings a form gives, as changes_from_flags takes them; for set, what is left empty
    stays as it is."""
    given = {}
    for key in TEXT:
        value = form.get(key, "").strip()
        if value or not for_set:
            given[key] = value
    for key in NUMBERS:
        raw = form.get(key, "").strip()
        if not raw:
            continue
        try:
            given[key] = int(raw)
        except ValueError:
            raise LlmgwError(f"{key.replace('_', ' ')} {raw!r} is not a whole number.") from None
    for key, sep in (("args", "\n"), ("fallbacks", ","), ("requires", ",")):
        items = [x.strip() for x in form.get(key, "").split(sep) if x.strip()]
        if items or not for_set:
            given[key] = tuple(items)
    share = form.get("share_gpu", "")
    if share in ("on", "off") or not for_set:
        given["share_gpu"] = share == "on"
    if not for_set and not given.get("engine"):
        given["engine"] = "llamacpp"
    return given


def _web_source(source, conf):
    """From a page, a model's file on the control plane must be a model: a .gguf file or a
    directory (safetensors), and never inside the control plane's own directory, which holds
    its keys. (An administrator at a shell may name any file with `llmgw model add`.)"""
    if not source or source.startswith(("http://", "https://", "mirror:")):
        return
    path = Path(source)
    if not path.is_absolute():
        raise LlmgwError(f"{source!r} is not an absolute path; give /path/to/model.gguf, a URL or mirror:NAME.")
    real, root = path.resolve(), Path(conf["_root"]).resolve()
    if real == root or root in real.parents:
        raise LlmgwError(f"{source} is inside the control plane's own directory ({root}), which holds "
                         f"its keys; a model's files live elsewhere (or in the mirror: mirror:NAME).")
    if not real.is_dir() and real.suffix.lower() != ".gguf":
        raise LlmgwError(f"{source}: from this page a file must be a .gguf model, or a directory of "
                         f"safetensors for vllm/sglang; `llmgw model add` on the control plane takes others.")


@bp.get("/models")
@admin_required
def models_page():
    rows = [model_view(m) for m in Model.select().order_by(Model.name)]
    return render_template("models.html", models=rows, engines=modelspec.ENGINES)


@bp.post("/models")
@admin_required
def model_action():
    """Add, change (set), scale or remove a model: what `model add|set|remove` do."""
    action, name = request.form.get("action", ""), request.form.get("name", "").strip()
    conf = current_app.config["LLMGW"]
    back = url_for("models.models_page") if action in ("add", "remove") else url_for("models.model_page", name=name)
    try:
        _web_source(request.form.get("source", "").strip(), conf)
        if action == "add":
            spec = modelspec.ModelSpec(name=name, **modelspec.changes_from_flags(_given(request.form, False), False))
            # Its file is read and hashed now: off the hub, so other requests go on meanwhile.
            row, created, warnings = off_the_hub(catalog.add, spec, conf)
            said = f"{'Added' if created else 'Replaced'} model {row.name}."
            back = url_for("models.model_page", name=row.name)
        elif action in ("set", "scale"):
            changes = modelspec.changes_from_flags(_given(request.form, True), True)
            if not changes:
                raise LlmgwError("nothing to change: fill in the settings to change.")
            row, warnings = off_the_hub(functools.partial(catalog.change, name, conf, **changes))
            said = f"Changed {', '.join(sorted(changes))} of {row.name}."
        elif action == "remove":
            # Waits (cooperatively) while the reconciler stops its replicas; runs nothing on nodes.
            stopped = model_removal.remove_by_reconciler(conf, name, request.form.get("force") == "on")
            said = f"Removed model {name}" + (f"; the reconciler stopped its {stopped} replica(s)." if stopped else ".")
            warnings = []
        else:
            abort(400, f"Unknown action {action!r}: add, set, scale or remove.")
    except (LlmgwError, modelspec.SpecError) as e:
        flash(f"Model {name or '(no name)'} not changed: {e}")
        return redirect(url_for("models.models_page") if action == "add" or not Model.get_or_none(Model.name == name)
                        else url_for("models.model_page", name=name))
    for w in warnings:
        flash(f"Warning: {w}")
    flash(said)
    return redirect(back)


@bp.get("/models/<path:name>")  # vLLM models are often named org/model
@admin_required
def model_page(name):
    model = Model.get_or_none(Model.name == name)
    if model is None:
        abort(404, f"There is no model called {name!r}.")
    lines, result = placing.explain(model, run=off_the_hub)
    est = model.estimate
    fits = []
    if est:
        classes = [{"class": c, **v} for c, v in sorted(catalog.cluster_classes().items())]
        fits = sizing.fits_by_class(est["gpu_bytes"], classes)
    return render_template("model.html", m=model_view(model), lines=lines, est=est, fits=fits,
                           engines=modelspec.ENGINES,
                           summary=result.verdicts[model.name]["summary"],
                           human=sizing.human_bytes)
