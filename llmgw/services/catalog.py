"""The model catalog: add, change and remove models, checked against the cluster and sized.

Models come from the CLI (origin "") or from [models.NAME] tables in server.toml (origin
"file"); the file's models follow the file at every start and refuse changes made elsewhere.
"""
import logging
import re
from dataclasses import asdict
from pathlib import Path

from ..errors import LlmgwError
from ..executors.release import sha256_file
from ..models import Model, Node, database
from ..plans import modelspec, sizing
from ..plans.modelspec import ModelSpec, SpecError
from ..plans.placement import slug
from . import mirror, weights

log = logging.getLogger("llmgw.catalog")
# Classes discovery names for cards in common use, so a model may name one before such a node joins.
KNOWN_CLASSES = ("a10-24g", "a100-40g", "a100-80g", "a30-24g", "a40-48g", "b200-192g", "h100-80g",
                 "h100-94g", "h200-141g", "l4-24g", "l40-48g", "l40s-48g", "rtx4090-24g",
                 "rtx6000-48g", "t4-16g", "v100-16g", "v100-32g")


def spec_of(model):
    """Return the ModelSpec a Model row holds."""
    return ModelSpec(name=model.name, engine=model.engine, source=model.source, sha256=model.sha256,
                     replicas=model.replicas, args=tuple(model.args or ()),
                     fallbacks=tuple(model.fallbacks or ()), gpus=model.gpus,
                     gpu_classes=tuple(model.gpu_classes or ()),
                     min_gpu_memory_mb=model.min_gpu_memory_mb, memory_mb=model.memory_mb,
                     context=model.context, requires=dict(model.requires or {}),
                     max_per_node=model.max_per_node, share_gpu=model.share_gpu,
                     on_nodes=model.on_nodes,
                     manifest=tuple(tuple(e) for e in model.manifest or ()))


def cluster_classes():
    """Return {class: {memory_mib, cards_max, node}} over the nodes discovered so far."""
    out = {}
    for node in Node.select(Node.name, Node.facts):
        counts = {}
        for g in (node.facts or {}).get("gpus", []):
            if g.get("class"):
                counts[g["class"]] = counts.get(g["class"], 0) + 1
                c = out.setdefault(g["class"], {"memory_mib": 0, "cards_max": 0, "node": ""})
                c["memory_mib"] = max(c["memory_mib"], g.get("memory_mib") or 0)
        for cls, n in counts.items():
            if n > out[cls]["cards_max"]:
                out[cls].update(cards_max=n, node=node.name)
    return out


def check_against_cluster(spec, classes):
    """Refuse settings no node could ever meet; return warnings for what none meets yet."""
    warnings = []
    for cls in spec.gpu_classes:
        if cls not in classes and cls not in KNOWN_CLASSES:
            present = ", ".join(sorted(classes)) or "none yet"
            raise LlmgwError(f"--gpu-class {cls!r} is neither in this cluster (it has: {present}) "
                             f"nor a known class ({', '.join(KNOWN_CLASSES)}); check the spelling "
                             f"against `flask llmgw nodes`.")
        if cls not in classes:
            warnings.append(f"no node has a {cls} card yet; replicas wait until one joins")
    wanted = [c for c in classes if not spec.gpu_classes or c in spec.gpu_classes]
    if _cards(spec) and classes and wanted:
        best = max(wanted, key=lambda c: (classes[c]["cards_max"], c))
        most = classes[best]["cards_max"]
        if spec.gpus > most:
            kind = " or ".join(spec.gpu_classes) if spec.gpu_classes else "GPU"
            raise LlmgwError(f"--gpus {spec.gpus}: no node has that many {kind} cards; the most on "
                             f"one node is {most} ({classes[best]['node']}). Lower --gpus, or add a "
                             f"node with more cards first.")
    elif _cards(spec) and not classes:
        warnings.append("no node has a GPU yet; replicas wait until one with enough cards joins")
    return warnings


def _cards(spec):
    """Return the cards one replica uses: a shared card counts as one."""
    return 1 if spec.share_gpu else spec.gpus


def size(spec):
    """Return (estimate dict or None, note) from the model's files on this machine."""
    local = local_path(spec)
    if local is None:
        return None, "its files are not on this machine, so it is not sized; give --memory"
    from ..facts import model_meta
    try:
        meta = model_meta.read_model(local)
        est = sizing.estimate(meta, spec.context, _cards(spec))
    except LlmgwError:
        raise  # not a model file at all: refused, with what to give instead
    except Exception as e:  # a config.json of a shape this reader does not know: no size
        return None, (f"{local} could not be sized ({type(e).__name__}: {e}); give --memory "
                      f"and --min-gpu-memory yourself")
    keep = {k: meta[k] for k in ("format", "quantisation", "parameters", "architecture")}
    return dict(est, **keep), ""


def local_path(spec):
    """Return the model's files on this machine, or None (a URL, a path only on the nodes)."""
    if not spec.source or re.match(r"^https?://", spec.source):
        return None
    path = Path(spec.source)
    return path if path.exists() else None


def size_warnings(spec, est, classes):
    """Return the warning when the declared cards cannot hold the estimate (never a refusal)."""
    if est is None or not _cards(spec):
        return []
    if spec.share_gpu:
        if spec.min_gpu_memory_mb and spec.min_gpu_memory_mb * sizing.MiB < est["gpu_bytes"]:
            return [f"the estimate is {sizing.human_bytes(est['gpu_bytes'])} per replica, more than "
                    f"the {spec.min_gpu_memory_mb} MiB share --min-gpu-memory gives it"]
        return []
    out = []
    for cls in spec.gpu_classes or sorted(classes):
        card = (classes.get(cls) or {}).get("memory_mib") or _class_mib(cls)
        warning = sizing.declared_warning(est, spec.gpus, card, cls)
        if warning:
            out.append(warning)
    return out


def _class_mib(cls):
    m = re.search(r"-(\d+)g$", cls)
    return int(int(m.group(1)) * 1024 * 0.97) if m else 0


def _check_source(spec, known_sha256=""):
    """Check the model's files fit its engine; return the spec with its checksum filled in.

    known_sha256: the checksum already recorded for this same file, which is then not hashed
    again (a 60 GB file takes minutes to read, and `model set --replicas` must not).
    """
    if not spec.source:
        return spec
    if spec.on_nodes:
        return spec
    if spec.engine in modelspec.DIRECTORY_ENGINES:
        if known_sha256 and spec.sha256 in ("", known_sha256) and spec.manifest:
            return spec.with_changes(source=_normal_source(spec), sha256=known_sha256)
        path = Path(spec.source).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise LlmgwError(
                f"{spec.engine} serves a directory with config.json and *.safetensors shards; "
                f"{spec.source!r} is not one on this machine. Give that directory, or "
                f"--node-path for one already on the nodes.")
        manifest = weights.manifest_of(path)
        digest = weights.manifest_digest(manifest)
        if spec.sha256 and spec.sha256 != digest:
            raise LlmgwError(f"--sha256 {spec.sha256[:12]}… does not match the manifest of {path} "
                             f"({digest[:12]}…: the sha256 of its files' list of path, size and "
                             f"sha256).")
        return spec.with_changes(source=str(path), sha256=digest, manifest=manifest)
    if known_sha256 and spec.sha256 in ("", known_sha256):
        # The same file as before, already checked and hashed.
        return spec.with_changes(source=_normal_source(spec), sha256=known_sha256)
    kind, source = weights.check_source(spec.source)
    if kind == "url":
        return spec.with_changes(source=source)
    if Path(source).is_dir():
        raise LlmgwError(f"--file {spec.source}: llama.cpp serves one GGUF file, and this is a "
                         f"directory; give the .gguf file inside it.")
    actual = sha256_file(source)
    if spec.sha256 and spec.sha256 != actual:
        raise LlmgwError(f"--sha256 {spec.sha256[:12]}… does not match {source} ({actual[:12]}…).")
    return spec.with_changes(source=source, sha256=actual)


def _check_names(spec):
    clash = next((m for m in Model.select(Model.name) if m.name != spec.name
                  and slug(m.name) == slug(spec.name)), None)
    if clash:
        raise LlmgwError(f"model {spec.name!r} would name its replicas like {clash.name!r} "
                         f"({slug(spec.name)}-0, …); choose a name that differs in more than case "
                         f"or punctuation.")
    sha = spec.sha256.strip().lower()
    if sha and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise LlmgwError(f"--sha256 {sha!r} is not a sha256 checksum (64 hex digits).")


def prepare(spec, known_sha256=""):
    """Check a spec against its files and the cluster; return (spec, estimate, warnings)."""
    try:
        spec = modelspec.check(spec)
    except SpecError as e:
        raise LlmgwError(str(e)) from e
    _check_names(spec)
    spec = _check_source(spec, known_sha256)
    classes = cluster_classes()
    warnings = check_against_cluster(spec, classes)
    est, note = size(spec)
    if spec.share_gpu and not spec.min_gpu_memory_mb and est is None:
        raise LlmgwError(f"--share-gpu needs --min-gpu-memory (how much of one card a replica "
                         f"takes): {spec.source or spec.name} cannot be sized from here.")
    if est is None and spec.engine != "sim":
        warnings.append(note)
    if spec.engine == "llamacpp" and not _cards(spec) and _offload_args(spec.args):
        warnings.append(f"{' '.join(spec.args)} asks llama.cpp to offload layers, but the model "
                        f"claims no GPU, so its engine sees none (CUDA_VISIBLE_DEVICES is empty): "
                        f"give --gpus N")
    return spec, est, warnings + size_warnings(spec, est, classes)


def _offload_args(args):
    return any(a.split("=", 1)[0] in ("-ngl", "--gpu-layers", "--n-gpu-layers") for a in args)


def save(spec, est, origin=""):
    """Write the spec to its Model row; return (row, created)."""
    values = {k: v for k, v in asdict(spec).items() if k != "name"}
    values.update(args=list(spec.args), fallbacks=list(spec.fallbacks) or None,
                  gpu_classes=list(spec.gpu_classes), estimate=est, origin=origin,
                  manifest=[list(e) for e in spec.manifest] or None)
    row = Model.get_or_none(Model.name == spec.name)
    if row is None:
        return Model.create(name=spec.name, **values), True
    Model.update(**values).where(Model.id == row.id).execute()
    return Model.get_by_id(row.id), False


def refuse_if_declared(model, conf):
    if model.origin == "file":
        raise LlmgwError(f"model {model.name!r} is declared in {conf['_path']} ([models.{model.name}]); "
                         f"change it there, and the catalog follows the file at the next start.")


def from_mirror(spec, conf):
    """Turn --file mirror:NAME into the mirrored file's path on this machine."""
    if spec.source.startswith("mirror:"):
        return spec.with_changes(source=str(mirror.path_of(conf, spec.source[len("mirror:"):])))
    return spec


def add(spec, conf):
    """Add a model, or replace every setting of one added before; return (row, created, warnings)."""
    existing = Model.get_or_none(Model.name == spec.name)
    if existing is not None:
        refuse_if_declared(existing, conf)
    spec, est, warnings = prepare(from_mirror(spec, conf))
    with database.atomic():
        row, created = save(spec, est)
    return row, created, warnings


def change(name, conf, **changes):
    """Change only the given settings of a model; return (row, warnings)."""
    model = get(name)
    refuse_if_declared(model, conf)
    try:
        spec = spec_of(model).with_changes(**changes)
    except SpecError as e:
        raise LlmgwError(str(e)) from e
    spec = from_mirror(spec, conf)
    # --file given again is the way to take a file changed in place: it is hashed anew.
    same_file = "source" not in changes and spec.engine == model.engine
    if not same_file and "sha256" not in changes:
        spec = spec.with_changes(sha256="", manifest=())  # a new file has its own checksum
    spec, est, warnings = prepare(spec, model.sha256 if same_file else "")
    if est is None and same_file and model.estimate:
        est = model.estimate  # its file is not here any more: the last estimate still stands
    with database.atomic():
        row, _ = save(spec, est)
    return row, warnings


def get(name):
    model = Model.get_or_none(Model.name == name)
    if model is None:
        names = ", ".join(m.name for m in Model.select(Model.name).order_by(Model.name)) or "none yet"
        raise LlmgwError(f"no model called {name!r} (models: {names}); `flask llmgw models` lists them.")
    return model


def _unchanged(row, spec):
    """Return whether a row already holds a declared spec (a file is not hashed again for it)."""
    have = spec_of(row).with_changes(manifest=())  # a declared table names no manifest
    if not spec.sha256:
        have = have.with_changes(sha256="")
    return have == spec.with_changes(source=_normal_source(spec), manifest=())


def _normal_source(spec):
    """Return the source as it is stored: a local path resolved, a URL or node path as given."""
    source = spec.source
    if source and not re.match(r"^https?://", source) and not spec.on_nodes:
        source = str(Path(source).expanduser().resolve())
    return source


def sync_declared(conf):
    """Make the catalog hold exactly the [models.NAME] tables of server.toml; return what changed.

    A declared model that cannot be used (its file gone, a class no node could have) is logged
    and left as it was, never half-written; the other models still follow the file.
    """
    declared = conf.get("models", {})
    said = []
    for name, spec in declared.items():
        row = Model.get_or_none(Model.name == name)
        try:
            spec = from_mirror(spec, conf)
        except LlmgwError as e:
            said.append(f"{name}: not taken from {conf['_path']}: {e}")
            continue
        if row is not None and row.origin == "file" and _unchanged(row, spec):
            continue
        known = row.sha256 if row is not None and row.source == _normal_source(spec) else ""
        if known and row.manifest:
            # The same directory as before: its manifest stands, its files are not hashed again.
            spec = spec.with_changes(manifest=tuple(tuple(e) for e in row.manifest))
        try:
            checked, est, warnings = prepare(spec, known)
        except (LlmgwError, OSError) as e:
            log.error("[models.%s] in %s cannot be used: %s", name, conf["_path"], e)
            said.append(f"{name}: not taken from {conf['_path']}: {e}")
            continue
        with database.atomic():
            save(checked, est, origin="file")
        said.append(f"{name}: {'taken over' if row is not None and row.origin != 'file' else 'declared'} "
                    f"from {conf['_path']}" + "".join(f"; {w}" for w in warnings))
    for row in Model.select().where(Model.origin == "file"):
        if row.name not in declared:
            row.delete_instance(recursive=True)
            said.append(f"{row.name}: removed, it is no longer in {conf['_path']}")
    return said
