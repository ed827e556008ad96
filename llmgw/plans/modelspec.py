"""What an operator may say about a model, from command-line flags or a [models.NAME] table.

Checked before anything is stored: sizes carry a unit, classes look like classes, labels hold
nothing a shell would read. Every message names the value and what would do instead.
"""
import re
from dataclasses import dataclass, field, replace

from .nodespec import LABEL_KEY, LABEL_VALUE

ENGINES = ("llamacpp", "vllm", "sglang", "sim")
DIRECTORY_ENGINES = ("vllm", "sglang")
SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT])(?:I?B)?$", re.IGNORECASE)
UNIT_MIB = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
CLASS = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*-\d+g$")
MAX_REPLICAS = 64
MAX_GPUS = 64
MAX_CONTEXT = 10_000_000


class SpecError(ValueError):
    """A model setting cannot be used; the message names it and the fix."""


@dataclass(frozen=True)
class ModelSpec:
    """A model's settings, checked; sizes in MiB, 0 or empty for "not required"."""

    name: str
    engine: str = "llamacpp"
    source: str = ""
    sha256: str = ""
    replicas: int = 1
    args: tuple = ()
    fallbacks: tuple = ()
    gpus: int = 0
    gpu_classes: tuple = ()
    min_gpu_memory_mb: int = 0
    memory_mb: int = 0
    context: int = 0
    requires: dict = field(default_factory=dict)
    max_per_node: int = 0
    share_gpu: bool = False
    on_nodes: bool = False
    # A directory's files as ((relative path, bytes, sha256), ...); sha256 is then the digest of
    # this list. Empty for a single file.
    manifest: tuple = ()

    def with_changes(self, **changes):
        """Return this spec with the given settings changed and the whole checked again."""
        return check(replace(self, **changes))


def parse_size(text, flag):
    """Return MiB from '40G', '512M', '1.5T', '12GiB' ('0' means none); refuse bare numbers."""
    text = str(text).strip()
    if text in ("0", ""):
        return 0
    if text.startswith("-"):
        raise SpecError(f"{flag} {text!r} is negative; give a size such as 40G, or 0 for none.")
    m = SIZE.match(text)
    if not m:
        hint = f"{text}G" if re.fullmatch(r"\d+(\.\d+)?", text) else "40G"
        raise SpecError(f"{flag} {text!r} is not a size with a unit; write e.g. {hint} "
                        f"(K, M, G, T: binary units, so 1G is 1024M).")
    return int(float(m.group(1)) * UNIT_MIB[m.group(2).upper()])


def parse_bytes(text, flag):
    """Return bytes from '512K', '100M', '1G' ('0' means none); the units of parse_size."""
    text = str(text).strip()
    if text in ("0", ""):
        return 0
    parse_size(text, flag)  # the same refusals, worded the same
    m = SIZE.match(text)
    return int(float(m.group(1)) * UNIT_MIB[m.group(2).upper()] * 1024 * 1024)


def parse_classes(value, flag="--gpu-class"):
    """Return a tuple of class names from 'h100-80g,a100-80g' or a list of them."""
    if not isinstance(value, (str, list, tuple)) or \
            not all(isinstance(c, str) for c in ([value] if isinstance(value, str) else value)):
        raise SpecError(f"{flag} {value!r} must be class names, e.g. \"h100-80g,a100-80g\" or "
                        f"[\"h100-80g\", \"a100-80g\"].")
    items = value.split(",") if isinstance(value, str) else list(value)
    classes = tuple(c.strip().lower() for c in items if c.strip())
    bad = [c for c in classes if not CLASS.match(c)]
    if bad:
        raise SpecError(f"{flag} {bad[0]!r} is not a GPU class; classes are a model and its "
                        f"memory, as discovery names them (e.g. h100-80g, l4-24g, a100-40g).")
    return classes


def parse_requires(items, flag="--require"):
    """Return {key: value} from ['pool=prod', …] or a {key: value} table."""
    pairs = list(items.items()) if isinstance(items, dict) else \
        [tuple(i.partition("=")[::2]) if "=" in i else (i, None) for i in items]
    out = {}
    for key, value in pairs:
        if value is None or not LABEL_KEY.match(str(key)) or not LABEL_VALUE.match(str(value)):
            shown = f"{key}={value}" if value is not None else key
            raise SpecError(f"{flag} {shown!r} is not KEY=VALUE with a key of lower-case letters, "
                            f"digits, '.', '_', '/', '-' and a value of letters, digits, '.', '_', "
                            f"':', '-' (e.g. {flag} pool=prod).")
        out[str(key)] = str(value)
    return out


def check(spec):
    """Return the spec when its settings fit together; raise SpecError naming the first that does not."""
    if not spec.name or len(spec.name) > 128 or any(c.isspace() for c in spec.name):
        raise SpecError(f"{spec.name!r} is not a usable model name: no spaces, at most 128 characters.")
    if spec.engine not in ENGINES:
        raise SpecError(f"--engine {spec.engine!r} is not one llmgw runs; use one of {', '.join(ENGINES)}.")
    _in_range("--replicas", spec.replicas, 0, MAX_REPLICAS)
    _in_range("--gpus", spec.gpus, 0, MAX_GPUS)
    _in_range("--context", spec.context, 0, MAX_CONTEXT)
    _in_range("--max-per-node", spec.max_per_node, 0, MAX_REPLICAS)
    if spec.name in spec.fallbacks:
        raise SpecError(f"model {spec.name!r} cannot be its own fallback.")
    keyed = next((a for a in spec.args or () if str(a).split("=")[0] in ("--api-key", "--api-key-file")), None)
    if keyed is not None:
        raise SpecError(f"--arg={keyed.split('=')[0]}: llmgw starts each replica's engine with a key "
                        f"of its own and sends it; remove that argument.")
    if spec.engine != "sim" and not spec.source:
        what = "a directory with config.json and safetensors shards" \
            if spec.engine in DIRECTORY_ENGINES else "a GGUF path or URL"
        raise SpecError(f"--file is required for a {spec.engine} model ({what}).")
    if spec.on_nodes and not spec.source.startswith("/"):
        raise SpecError(f"--node-path must be an absolute path on the nodes, not {spec.source!r}; "
                        f"e.g. /srv/models/{spec.name}.")
    if spec.on_nodes and ".." in spec.source.split("/"):
        raise SpecError(f"--node-path {spec.source!r} climbs out with '..'; give the path as it is, "
                        f"e.g. /srv/models/{spec.name}.")
    if spec.engine in DIRECTORY_ENGINES and not spec.gpus and not spec.share_gpu:
        raise SpecError(f"{spec.engine} serves on GPUs here: give --gpus N (cards per replica, "
                        f"its tensor parallel size) or --share-gpu.")
    if spec.share_gpu and spec.gpus > 1:
        raise SpecError(f"--share-gpu shares one card between replicas; it cannot go with "
                        f"--gpus {spec.gpus}. Use --gpus 1 (or leave it out) with --share-gpu.")
    if (spec.gpu_classes or spec.min_gpu_memory_mb) and not spec.gpus and not spec.share_gpu:
        raise SpecError("--gpu-class and --min-gpu-memory say which cards to use, but --gpus is 0 "
                        "(a CPU model); give --gpus N too.")
    return spec


def _in_range(flag, value, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise SpecError(f"{flag} {value!r} is out of range; give a whole number from {lo} to {hi}.")


TABLE_KEYS = {"file": "source", "engine": "engine", "replicas": "replicas", "sha256": "sha256",
              "args": "args", "fallbacks": "fallbacks", "gpus": "gpus", "gpu_class": "gpu_classes",
              "min_gpu_memory": "min_gpu_memory_mb", "memory": "memory_mb", "context": "context",
              "require": "requires", "max_per_node": "max_per_node", "share_gpu": "share_gpu",
              "on_nodes": "on_nodes", "node_path": "source"}


# In a [models.NAME] table a setting is its key, not its command-line flag.
FLAG_KEYS = {"file": "file", "engine": "engine", "replicas": "replicas", "sha256": "sha256",
             "gpus": "gpus", "gpu-class": "gpu_class", "min-gpu-memory": "min_gpu_memory",
             "memory": "memory", "context": "context", "require": "require",
             "max-per-node": "max_per_node", "share-gpu": "share_gpu", "on-nodes": "on_nodes",
             "node-path": "node_path"}


def from_table(name, table, where):
    """Return the ModelSpec of a [models.NAME] table; errors name the key and the file."""
    try:
        return check(ModelSpec(name=name, **_table_values(name, table)))
    except SpecError as e:
        said = re.sub(r"--([a-z-]+)", lambda m: FLAG_KEYS.get(m.group(1), m.group(0)), str(e))
        raise SpecError(f"{where}: [models.{name}]: {said}") from None


def _table_values(name, table):
    if not isinstance(table, dict):
        raise SpecError(f"must be a table of settings like file = \"/srv/qwen.gguf\"; got {table!r}.")
    unknown = sorted(set(table) - set(TABLE_KEYS))
    if unknown:
        raise SpecError(f"unknown key {unknown[0]!r}; known keys: {', '.join(sorted(TABLE_KEYS))}.")
    if "node_path" in table and "file" in table:
        raise SpecError("give file (copied to the nodes) or node_path (already there), not both.")
    values = {}
    for key, value in table.items():
        values[TABLE_KEYS[key]] = _table_value(key, value)
    if "node_path" in table:
        values["on_nodes"] = True
    return values


def _table_value(key, value):
    if key in ("min_gpu_memory", "memory"):
        return parse_size(value, key)
    if key == "gpu_class":
        return parse_classes(value, key)
    if key == "require":
        return parse_requires(value, key)
    if key in ("args", "fallbacks"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise SpecError(f"{key} = {value!r} must be a list of strings, e.g. {key} = [\"a\", \"b\"].")
        return tuple(value)
    if key in ("share_gpu", "on_nodes"):
        if not isinstance(value, bool):
            raise SpecError(f"{key} = {value!r} must be true or false.")
        return value
    if key in ("replicas", "gpus", "context", "max_per_node"):
        if not isinstance(value, int) or isinstance(value, bool):
            raise SpecError(f"{key} = {value!r} must be a whole number.")
        return value
    if not isinstance(value, str):
        raise SpecError(f"{key} = {value!r} must be a string.")
    return value.strip().lower() if key == "sha256" else value


def changes_from_flags(given, for_set):
    """Turn the settings given as `model add`/`model set` flags (or the model page's form, with
    the same names) into ModelSpec fields: sizes parsed, lists as tuples. For set, a setting
    left None (or an empty list) is unchanged."""
    out = {}
    for key, value in given.items():
        if value is None or (for_set and key in ("args", "fallbacks", "requires") and not value):
            continue
        if key == "gpu_class":
            out["gpu_classes"] = parse_classes(value)
        elif key == "min_gpu_memory":
            out["min_gpu_memory_mb"] = parse_size(value, "--min-gpu-memory")
        elif key == "memory":
            out["memory_mb"] = parse_size(value, "--memory")
        elif key == "requires":
            out["requires"] = parse_requires(value)
        elif key in ("args", "fallbacks"):
            out[key] = tuple(value)
        elif key == "sha256":
            out[key] = value.strip().lower()
        elif key == "node_path":
            if value:
                if given.get("source"):
                    raise SpecError("give --file (copied to the nodes) or --node-path (already "
                                    "there), not both.")
                out.update(source=value, on_nodes=True)
        elif key not in out:
            out[key] = value
    return out
