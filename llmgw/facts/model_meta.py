"""A model's shape and size, read from its files on the control plane.

Two layouts: one GGUF file (llama.cpp), or a Hugging Face directory with config.json and
*.safetensors shards. Only metadata is read: a GGUF's header and tensor table, a
directory's config.json and the shard file sizes, so a 140 GB model reads in a moment.
"""
import json
import re
from collections import Counter
from pathlib import Path

from ..errors import LlmgwError

GGUF_MAGIC = b"GGUF"
WHAT_TO_GIVE = "give a .gguf file or a directory with config.json and *.safetensors shards"
# Bytes per stored element, to turn a directory's size back into a parameter count.
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1}
# Quantisers that store one byte per weight whatever torch_dtype says.
ONE_BYTE_METHODS = ("fp8", "fbgemm_fp8", "compressed-tensors")
SHARD_INDEX = "model.safetensors.index.json"
# llama.cpp's gguf-split names: model-00001-of-00003.gguf.
SPLIT_NAME = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def read_model(path):
    """Read a model's metadata from a .gguf file or a safetensors directory."""
    p = _existing(path)
    return read_safetensors_dir(p) if p.is_dir() else read_gguf(p)


def _existing(path):
    p = Path(path).expanduser()
    if not p.exists():
        raise LlmgwError(f"no file or directory at {p} on this machine (the control plane); "
                         f"{WHAT_TO_GIVE}")
    return p


# --- GGUF ---------------------------------------------------------------------------------

def read_gguf(path):
    """Read a GGUF file's architecture, shape, parameter count and quantisation."""
    p = _existing(path)
    if p.is_dir():
        raise LlmgwError(f"{p} is a directory, not a GGUF file; {WHAT_TO_GIVE}")
    given = _open_gguf(p)
    files = _split_files(p, given)
    readers = [given if f == p else _open_gguf(f) for f in files]
    fields = _fields(readers[0])  # only the first split carries the model's metadata
    arch = fields.get("general.architecture")
    if not arch:
        raise LlmgwError(f"{files[0]} has no general.architecture in its metadata; the file "
                         "is damaged or was not written by a llama.cpp converter")
    tensors = [t for r in readers for t in r.tensors]
    return {"format": "gguf", "path": str(p), "architecture": arch,
            "parameters": sum(int(t.n_elements) for t in tensors),
            **_gguf_shape(files[0], fields, arch),
            "quantisation": _gguf_quantisation(fields, tensors),
            "weights_bytes": sum(f.stat().st_size for f in files), "kv_dtype_bytes": 2}


def _fields(reader):
    # The tokenizer's arrays hold 100k+ strings; decoding them would take most of the time.
    return {name: field.contents() for name, field in reader.fields.items()
            if not name.startswith("tokenizer.")}


def _split_files(p, reader):
    """Return every file of a model split by gguf-split, in order, or just [p]."""
    field = reader.fields.get("split.count")
    count = int(field.contents()) if field else 1
    m = SPLIT_NAME.match(p.name)
    if count <= 1 or not m:
        return [p]
    files = [p.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf")
             for i in range(1, count + 1)]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise LlmgwError(f"{p} is one of {count} split files, and these are not beside it: "
                         f"{_some(missing)}; the download is incomplete: fetch every "
                         "split into the same directory")
    return files


def _some(names):
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _check_magic(p):
    try:
        with open(p, "rb") as f:
            head = f.read(4)
    except OSError as e:
        raise LlmgwError(f"cannot read {p} ({e.strerror}); let the user running llmgw read "
                         "it") from e
    if head != GGUF_MAGIC:
        start = f"it starts with {head!r}" if head else "it is empty"
        raise LlmgwError(f"{p} is not a GGUF file ({start}, not b'GGUF'); {WHAT_TO_GIVE}")


def _open_gguf(p):
    _check_magic(p)
    # numpy and gguf load here, not at import: web workers import this module too.
    import gguf
    try:
        return gguf.GGUFReader(str(p))
    except Exception as e:  # the reader raises ValueError, IndexError, OSError… on bad files
        raise LlmgwError(f"{p} starts like a GGUF file but cannot be read ({type(e).__name__}: "
                         f"{e}); it is probably truncated or damaged: download it again"
                         ) from e


def _gguf_shape(p, fields, arch):
    def get(key, default=None):
        value = fields.get(f"{arch}.{key}", default)
        if value is None:
            raise LlmgwError(f"{p} has no {arch}.{key} in its metadata; llmgw cannot size "
                             "a model without it (is the file complete?)")
        # Some architectures store one value per layer; the largest one sizes the cache.
        return int(max(value)) if isinstance(value, list) else int(value)

    heads = get("attention.head_count", 0)
    embedding = get("embedding_length")
    return {"layers": get("block_count"), "heads": heads,
            "kv_heads": get("attention.head_count_kv", heads), "embedding": embedding,
            "head_dim": get("attention.key_length", embedding // heads if heads else 0),
            "context_trained": get("context_length", 0)}


def _gguf_quantisation(fields, tensors):
    import gguf
    file_type = fields.get("general.file_type")
    known = {int(t) for t in gguf.LlamaFileType} - {int(gguf.LlamaFileType.GUESSED)}
    if file_type in known:
        name = gguf.LlamaFileType(file_type).name
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    # Weighted by elements: the many small F32 norm vectors must not outvote the matrices.
    counts = Counter()
    for t in tensors:
        counts[t.tensor_type.name] += int(t.n_elements)
    return counts.most_common(1)[0][0] if counts else "unknown"


# --- safetensors directory ----------------------------------------------------------------

def read_safetensors_dir(path):
    """Read a Hugging Face model directory's config.json and shard sizes."""
    p = _existing(path)
    if not p.is_dir():
        raise LlmgwError(f"{p} is a file, not a model directory; {WHAT_TO_GIVE}")
    config = _config(p)
    nested = config.get("text_config")
    text = {**config, **(nested if isinstance(nested, dict) else {})}
    weights = sum(s.stat().st_size for s in _shards(p))
    heads = _need(p, text, "num_attention_heads")
    embedding = _need(p, text, "hidden_size")
    return {"format": "safetensors", "path": str(p), "architecture": _architecture(config),
            "parameters": int(weights / _bytes_per_weight(text)),
            "layers": _need(p, text, "num_hidden_layers"), "heads": heads,
            "kv_heads": int(text.get("num_key_value_heads") or heads), "embedding": embedding,
            "head_dim": int(text.get("head_dim") or embedding // heads),
            "context_trained": int(text.get("max_position_embeddings") or 0),
            "quantisation": _st_quantisation(text), "weights_bytes": weights,
            "kv_dtype_bytes": 2}


def _config(p):
    f = p / "config.json"
    if not f.is_file():
        raise LlmgwError(f"{p} has no config.json; {WHAT_TO_GIVE} (a Hugging Face download "
                         "has both)")
    try:
        config = json.loads(f.read_text())
    except (ValueError, OSError) as e:
        raise LlmgwError(f"{f} cannot be read as JSON ({e}); download it again") from e
    if not isinstance(config, dict):
        raise LlmgwError(f"{f} is JSON but not an object; download it again")
    return config


def _shards(p):
    index = p / SHARD_INDEX
    if index.is_file():
        return _indexed_shards(p, index)
    shards = sorted(p.glob("*.safetensors"))
    if not shards:
        raise LlmgwError(f"{p} has config.json but no *.safetensors shards; download the "
                         "weights too (or give a .gguf file)")
    # Some repositories (Mistral's) ship the same weights twice: consolidated.safetensors
    # for their own runtime beside the model-*.safetensors shards; count them once.
    transformers_shards = [s for s in shards if not s.name.startswith("consolidated")]
    return transformers_shards or shards


def _indexed_shards(p, index):
    try:
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        raise LlmgwError(f"{index} has no readable weight_map ({e}); download it again") from e
    missing = [n for n in names if not (p / n).is_file()]
    if missing:
        raise LlmgwError(f"{p} lacks {len(missing)} of the {len(names)} shards its "
                         f"{SHARD_INDEX} lists ({_some(missing)}); the download is "
                         "incomplete: fetch the missing shards")
    return [p / n for n in names]


def _need(p, config, key):
    value = config.get(key)
    if not isinstance(value, int) or value <= 0:
        raise LlmgwError(f"{p / 'config.json'} has no usable {key} (found {value!r}, at the "
                         "top or under text_config); llmgw needs it to size the model: use "
                         "the config.json published with the weights")
    return value


def _architecture(config):
    names = config.get("architectures") or []
    return str(names[0] if names else config.get("model_type") or "unknown")


def _dtype(config):
    # transformers renamed torch_dtype to dtype in 2025; configs carry either.
    return str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")


def _quant(config):
    """Return the quantization_config table, or {} when there is none or it is not a table."""
    quant = config.get("quantization_config")
    return quant if isinstance(quant, dict) else {}


def _bytes_per_weight(config):
    quant = _quant(config)
    if isinstance(quant.get("bits"), (int, float)) and quant["bits"] > 0:
        return quant["bits"] / 8  # GPTQ/AWQ pack 4-bit weights whatever torch_dtype says
    if quant.get("quant_method") in ONE_BYTE_METHODS:
        return 1
    return DTYPE_BYTES.get(_dtype(config), 2)


def _st_quantisation(config):
    quant = _quant(config)
    return str(quant.get("quant_method") or _dtype(config))
