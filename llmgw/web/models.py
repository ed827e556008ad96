"""A model's page: what it needs, where its replicas run, and every node's verdict."""
from flask import Blueprint, abort, render_template

from ..models import Model
from ..plans import sizing
from ..services import catalog, placing
from ..services.model_views import model_view
from . import admin_required

from ..green import off_the_hub

bp = Blueprint("models", __name__)


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
                           summary=result.verdicts[model.name]["summary"],
                           human=sizing.human_bytes)
