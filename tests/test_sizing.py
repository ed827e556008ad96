"""Reading a model's metadata (GGUF, safetensors directory) and sizing one replica."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from llmgw.errors import LlmgwError
from llmgw.facts.model_meta import read_gguf, read_model, read_safetensors_dir
from llmgw.plans import sizing
from llmgw.plans.sizing import GiB, MiB
from tests.harness import tiny_gguf

CONFIGS = Path(__file__).parent / "cases" / "model_configs"

H100 = {"class": "h100-80g", "memory_mib": 81559, "cards_max": 8}
L4 = {"class": "l4-24g", "memory_mib": 23034, "cards_max": 4}


# --- GGUF ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return tiny_gguf.write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def test_tiny_gguf_reads_every_field(tiny):
    n_vocab = 467
    assert len(tiny_gguf._vocab()[0]) == n_vocab
    e, ff = tiny_gguf.N_EMBD, tiny_gguf.N_FF
    # token_embd and output are [n_vocab, e]; output_norm [e]; each block: 2 norms [e],
    # q/k/v/o [e, e] (4 kv heads of 16 = e) and gate/up/down [ff, e].
    per_block = 2 * e + 4 * e * e + 3 * ff * e
    assert read_gguf(tiny) == {
        "format": "gguf", "path": str(tiny), "architecture": "llama",
        "parameters": 2 * n_vocab * e + e + tiny_gguf.N_BLOCK * per_block,
        "layers": 2, "heads": 4, "kv_heads": 4, "embedding": 64, "head_dim": 16,
        "context_trained": 2048, "quantisation": "F16",
        "weights_bytes": tiny.stat().st_size, "kv_dtype_bytes": 2}


def test_read_model_dispatches_a_file_to_gguf(tiny):
    assert read_model(str(tiny))["format"] == "gguf"


def _write_gguf(path, file_type=None, kv_heads=2, key_length=None, split_max_tensors=0):
    """Write a small llama GGUF: 8 heads over embedding 64, F16 matrices, F32 norms."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split_max_tensors)
    w.add_context_length(8192)
    w.add_embedding_length(64)
    w.add_block_count(3)
    w.add_head_count(8)
    w.add_head_count_kv(kv_heads)
    if key_length:
        w.add_key_length(key_length)
    if file_type is not None:
        w.add_file_type(file_type)
    w.add_tensor("token_embd.weight", np.zeros((100, 64), dtype=np.float16))
    for i in range(3):  # more F32 tensors than F16 ones, but far fewer elements
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_with_grouped_query_attention_and_a_k_quant(tmp_path):
    import gguf

    meta = read_gguf(_write_gguf(tmp_path / "gqa.gguf", gguf.LlamaFileType.MOSTLY_Q4_K_M))
    assert (meta["heads"], meta["kv_heads"], meta["head_dim"]) == (8, 2, 8)
    assert meta["quantisation"] == "Q4_K_M"
    assert meta["parameters"] == 100 * 64 + 3 * 64
    assert (meta["layers"], meta["context_trained"]) == (3, 8192)


@pytest.mark.parametrize("file_type,name", [(0, "F32"), (32, "BF16"), (7, "Q8_0")])
def test_gguf_file_type_names_drop_the_mostly_prefix(tmp_path, file_type, name):
    assert read_gguf(_write_gguf(tmp_path / "m.gguf", file_type))["quantisation"] == name


@pytest.mark.parametrize("file_type", [None, 1024, 999])  # absent, GUESSED, unknown
def test_gguf_without_a_file_type_names_the_type_holding_most_weights(tmp_path, file_type):
    assert read_gguf(_write_gguf(tmp_path / "m.gguf", file_type))["quantisation"] == "F16"


def test_gguf_key_length_and_per_layer_kv_heads(tmp_path):
    meta = read_gguf(_write_gguf(tmp_path / "m.gguf", kv_heads=[2, 4, 1], key_length=32))
    assert (meta["kv_heads"], meta["head_dim"]) == (4, 32)


def test_split_gguf_sums_every_split(tmp_path):
    _write_gguf(tmp_path / "m.gguf", split_max_tensors=2)
    files = [tmp_path / "m-00001-of-00002.gguf", tmp_path / "m-00002-of-00002.gguf"]
    for given in files:  # a person may name any of the splits
        meta = read_gguf(given)
        assert meta["parameters"] == 100 * 64 + 3 * 64
        assert meta["weights_bytes"] == sum(f.stat().st_size for f in files)
        assert (meta["architecture"], meta["kv_heads"], meta["path"]) == ("llama", 2, str(given))
    files[1].unlink()
    msg = _error(read_gguf, files[0])
    assert f"{files[0]} is one of 2 split files, and these are not beside it: " \
        "m-00002-of-00002.gguf; the download is incomplete" in msg


def test_importing_the_reader_loads_neither_gguf_nor_numpy():
    code = ("import sys, llmgw.facts.model_meta, llmgw.plans.sizing; "
            "print(sorted({'gguf', 'numpy'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "[]"


# --- safetensors directories --------------------------------------------------------------

def _model_dir(tmp_path, config, shards, index=False):
    """Build a model directory: config.json and sparse shards of the given sizes."""
    d = tmp_path / "model"
    d.mkdir()
    (d / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    for name, size in zip(names, shards):
        with open(d / name, "wb") as f:
            f.truncate(size)
    if index:
        weight_map = {f"layer.{i}": n for i, n in enumerate(names)}
        (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def _config(name):
    return json.loads((CONFIGS / f"{name}.json").read_text())


# Shard sizes close to the published ones; the sums are what the meta reports.
LLAMA_SHARDS = [4976698672, 4999802720, 4915916176, 1168138808]
CASES = {
    "llama-3.1-8b-instruct": (LLAMA_SHARDS, {
        "architecture": "LlamaForCausalLM", "layers": 32, "heads": 32, "kv_heads": 8,
        "embedding": 4096, "head_dim": 128, "context_trained": 131072,
        "quantisation": "bfloat16"}),
    "qwen2.5-7b-instruct": ([3945441440, 3864726352, 3864726408, 3556377672], {
        "architecture": "Qwen2ForCausalLM", "layers": 28, "heads": 28, "kv_heads": 4,
        "embedding": 3584, "head_dim": 128, "context_trained": 32768,
        "quantisation": "bfloat16"}),
    "mistral-7b-instruct-v0.3": ([4949453792, 4999819336, 4546807800], {
        "architecture": "MistralForCausalLM", "layers": 32, "heads": 32, "kv_heads": 8,
        "embedding": 4096, "head_dim": 128, "context_trained": 32768,
        "quantisation": "bfloat16"}),
    # Multimodal: the text model's shape sits under text_config, with no
    # max_position_embeddings, and head_dim 128 is not hidden_size // heads (168).
    "gemma-3-27b-it": ([4_900_000_000] * 11 + [1_000_000_000], {
        "architecture": "Gemma3ForConditionalGeneration", "layers": 62, "heads": 32,
        "kv_heads": 16, "embedding": 5376, "head_dim": 128, "context_trained": 0,
        "quantisation": "bfloat16"}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_config_reads_to_expected_meta(tmp_path, name):
    shards, expected = CASES[name]
    d = _model_dir(tmp_path, _config(name), shards)
    weights = sum(shards)
    assert read_model(d) == {"format": "safetensors", "path": str(d), **expected,
                             "parameters": weights // 2, "weights_bytes": weights,
                             "kv_dtype_bytes": 2}


def test_llama_3_1_8b_kv_cache_is_128_kib_a_token_and_1_gib_at_8192(tmp_path):
    meta = read_safetensors_dir(_model_dir(tmp_path, _config("llama-3.1-8b-instruct"),
                                           LLAMA_SHARDS))
    assert sizing.kv_bytes_per_token(meta) == 131072 == 2 * 32 * 8 * 128 * 2
    est = sizing.estimate(meta, context=8192)
    assert est["kv_bytes"] == 1 * GiB
    assert est["gpu_bytes"] == sum(LLAMA_SHARDS) + GiB + sum(LLAMA_SHARDS) // 20


def test_consolidated_copy_beside_the_shards_is_not_counted_twice(tmp_path):
    shards = CASES["mistral-7b-instruct-v0.3"][0]
    d = _model_dir(tmp_path, _config("mistral-7b-instruct-v0.3"), shards)
    with open(d / "consolidated.safetensors", "wb") as f:
        f.truncate(sum(shards))
    assert read_model(d)["weights_bytes"] == sum(shards)


def test_index_names_the_shards(tmp_path):
    d = _model_dir(tmp_path, _config("qwen2.5-7b-instruct"), [1000, 2000], index=True)
    (d / "stray.safetensors").write_bytes(b"x" * 500)
    assert read_model(d)["weights_bytes"] == 3000


@pytest.mark.parametrize("quant,bytes_per_weight,name", [
    ({"quant_method": "awq", "bits": 4}, 0.5, "awq"),
    ({"quant_method": "fp8"}, 1, "fp8"),
])
def test_quantised_directory_counts_parameters_by_stored_width(tmp_path, quant,
                                                                bytes_per_weight, name):
    config = {**_config("llama-3.1-8b-instruct"), "torch_dtype": "float16",
              "quantization_config": quant}
    meta = read_model(_model_dir(tmp_path, config, [4_000_000_000]))
    assert meta["parameters"] == int(4_000_000_000 / bytes_per_weight)
    assert meta["quantisation"] == name


def test_new_transformers_dtype_key_and_no_kv_heads(tmp_path):
    config = {"model_type": "gpt2-ish", "dtype": "float32", "hidden_size": 768,
              "num_hidden_layers": 12, "num_attention_heads": 12}
    meta = read_model(_model_dir(tmp_path, config, [400]))
    assert (meta["architecture"], meta["kv_heads"], meta["head_dim"]) == ("gpt2-ish", 12, 64)
    assert (meta["parameters"], meta["quantisation"]) == (100, "float32")


# --- errors a person sees -----------------------------------------------------------------

def _error(fn, path):
    with pytest.raises(LlmgwError) as e:
        fn(path)
    return str(e.value)


@pytest.mark.parametrize("fn", [read_model, read_gguf, read_safetensors_dir])
def test_missing_path(tmp_path, fn):
    msg = _error(fn, tmp_path / "nope.gguf")
    assert f"no file or directory at {tmp_path / 'nope.gguf'}" in msg


def test_text_file_named_gguf(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_text("hello, this is not a model")
    msg = _error(read_model, p)
    assert f"{p} is not a GGUF file (it starts with b'hell'" in msg
    assert "give a .gguf file or a directory with config.json" in msg


def test_empty_file(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"")
    assert f"{p} is not a GGUF file (it is empty" in _error(read_model, p)


@pytest.mark.parametrize("keep", [100, 0.5])
def test_truncated_gguf(tmp_path, tiny, keep):
    data = tiny.read_bytes()
    p = tmp_path / "cut.gguf"
    p.write_bytes(data[:keep if isinstance(keep, int) else int(len(data) * keep)])
    msg = _error(read_gguf, p)
    assert f"{p} starts like a GGUF file but cannot be read" in msg
    assert "truncated or damaged: download it again" in msg


def test_directory_given_to_read_gguf_and_file_to_read_safetensors_dir(tmp_path, tiny):
    assert f"{tmp_path} is a directory, not a GGUF file" in _error(read_gguf, tmp_path)
    assert f"{tiny} is a file, not a model directory" in _error(read_safetensors_dir, tiny)


def test_directory_without_config(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"x")
    assert f"{tmp_path} has no config.json" in _error(read_model, tmp_path)


def test_directory_without_shards(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(_config("qwen2.5-7b-instruct")))
    assert f"{tmp_path} has config.json but no *.safetensors shards" in _error(read_model,
                                                                               tmp_path)


def test_config_missing_a_needed_key(tmp_path):
    config = _config("llama-3.1-8b-instruct")
    del config["num_hidden_layers"]
    d = _model_dir(tmp_path, config, [1000])
    msg = _error(read_model, d)
    assert f"{d / 'config.json'} has no usable num_hidden_layers (found None" in msg


def test_config_that_is_not_json(tmp_path):
    d = _model_dir(tmp_path, "{not json", [1000])
    assert f"{d / 'config.json'} cannot be read as JSON" in _error(read_model, d)


def test_index_naming_a_shard_that_is_not_there(tmp_path):
    d = _model_dir(tmp_path, _config("qwen2.5-7b-instruct"), [1000, 2000], index=True)
    (d / "model-00002-of-00002.safetensors").unlink()
    msg = _error(read_model, d)
    assert f"{d} lacks 1 of the 2 shards" in msg and "model-00002-of-00002" in msg


# --- sizing arithmetic --------------------------------------------------------------------

LLAMA = {"format": "safetensors", "path": "/models/llama", "architecture": "LlamaForCausalLM",
         "parameters": 8_030_278_188, "layers": 32, "heads": 32, "kv_heads": 8,
         "embedding": 4096, "head_dim": 128, "context_trained": 131072,
         "quantisation": "bfloat16", "weights_bytes": 16_060_556_376, "kv_dtype_bytes": 2}


def test_estimate_context_defaults_to_trained_then_4096():
    assert sizing.estimate(LLAMA)["context"] == 131072
    assert sizing.estimate({**LLAMA, "context_trained": 0})["context"] == 4096
    assert sizing.estimate(LLAMA, context=1000)["context"] == 1000


def test_estimate_overhead_and_host_memory():
    small = {**LLAMA, "weights_bytes": 1_000_000_000}
    est = sizing.estimate(small, context=100)
    assert est["overhead_bytes"] == 512 * MiB
    assert est["host_bytes"] == 2 * GiB
    assert est["gpu_bytes"] == 1_000_000_000 + 100 * 131072 + 512 * MiB
    big = sizing.estimate({**LLAMA, "weights_bytes": 140_000_000_000}, context=100)
    assert (big["overhead_bytes"], big["host_bytes"]) == (7_000_000_000, 14_000_000_000)
    cpu = sizing.estimate(small, context=100, gpus=0)
    assert cpu["host_bytes"] == cpu["gpu_bytes"] == est["gpu_bytes"]


def test_cards_needed_at_and_past_the_boundary():
    one = sizing.usable_bytes(81559)
    assert one == 81559 * MiB * 0.9
    assert sizing.cards_needed(one, 81559) == 1
    assert sizing.cards_needed(one + 1, 81559) == 2
    assert sizing.cards_needed(2 * one + 1, 81559) == 4  # 3 cards is no tensor-parallel size
    assert sizing.cards_needed(8 * one, 81559) == 8
    assert sizing.cards_needed(8 * one + 1, 81559) is None
    assert sizing.cards_needed(2 * one + 1, 81559, max_cards=3) is None
    assert sizing.cards_needed(one, 81559, usable=0.5) == 2


def test_fits_by_class_sorted_with_reasons():
    gpu_bytes = sizing.usable_bytes(23034, 4) + 1  # just too big for 4 l4s
    fits = sizing.fits_by_class(gpu_bytes, [L4, H100])
    assert fits == [
        {"class": "h100-80g", "memory_mib": 81559, "cards": 2, "per_card_bytes": gpu_bytes / 2,
         "why": ""},
        {"class": "l4-24g", "memory_mib": 23034, "cards": None, "per_card_bytes": None,
         "why": "needs 8 l4-24g cards (24.2 GB each); the most healthy on one node is 4"}]


def test_fits_by_class_too_big_for_eight_cards():
    gpu_bytes = int(sizing.usable_bytes(23034, 8)) + 1
    [fit] = sizing.fits_by_class(gpu_bytes, [{**L4, "cards_max": 8}])
    assert fit["cards"] is None
    assert fit["why"] == ("needs 9 or more l4-24g cards (24.2 GB each); one replica spans "
                          "at most 8 cards of one node")


def test_declared_warning():
    room = sizing.usable_bytes(23034, 2)
    assert sizing.declared_warning({"gpu_bytes": room}, 2, 23034, "l4-24g") == ""
    assert sizing.declared_warning({"gpu_bytes": 10 ** 15}, 0, 23034) == ""
    warning = sizing.declared_warning({"gpu_bytes": 50 * 10 ** 9}, 2, 23034, "l4-24g")
    assert warning == ("the estimate is 50.0 GB per replica, more than 2 × l4-24g (43.5 GB "
                       "usable) hold; it will likely fail to load (raise --gpus or pick a "
                       "larger --gpu-class)")
    assert "1 × 24.2 GB card (21.7 GB usable)" in sizing.declared_warning(
        {"gpu_bytes": room}, 1, 23034)


def test_human_bytes():
    assert [sizing.human_bytes(n) for n in (900, 4_680_000_000, 17_937_326_018,
                                            803_027_818, 2 * 10 ** 12)] == [
        "900 B", "4.68 GB", "17.9 GB", "803 MB", "2.00 TB"]


def test_describe_llama_at_8192_on_h100_and_l4():
    est = sizing.estimate(LLAMA, context=8192)
    lines = sizing.describe(LLAMA, est, sizing.fits_by_class(est["gpu_bytes"], [L4, H100]))
    assert lines == [
        "weights       16.1 GB  (safetensors, bfloat16, 8.03 B parameters, LlamaForCausalLM)",
        "layers        32 · heads 32 · kv heads 8 · head dim 128 · embedding 4096",
        "KV cache      128 KiB per token · 1.07 GB at 8192 tokens (trained for 131072)",
        "one replica   17.9 GB on GPUs (weights + KV cache + 803 MB buffers); 2.15 GB host RAM",
        "fits on       h100-80g: 1 card · l4-24g: 1 card"]


def test_describe_names_what_cannot_hold_it_and_a_long_context():
    est = sizing.estimate(LLAMA, context=262144)
    t4 = {"class": "t4-16g", "memory_mib": 15360, "cards_max": 1}
    lines = sizing.describe(LLAMA, est, sizing.fits_by_class(est["gpu_bytes"], [L4, H100, t4]))
    assert "34.4 GB at 262144 tokens (beyond the 131072 it was trained for)" in lines[2]
    assert lines[4:] == ["fits on       h100-80g: 1 card · l4-24g: 4 cards",
                         "cannot use    t4-16g: needs 4 t4-16g cards (16.1 GB each); the most "
                         "healthy on one node is 1"]


def test_describe_without_gpus():
    est = sizing.estimate({**LLAMA, "context_trained": 0}, gpus=0)
    lines = sizing.describe({**LLAMA, "context_trained": 0}, est, [])
    assert "at 4096 tokens (the model does not say its trained context)" in lines[2]
    assert lines[3] == "one replica   17.4 GB host RAM on CPU (weights + KV cache + 803 MB buffers)"
    assert lines[4] == "fits on       no GPU in the cluster; a CPU replica needs 17.4 GB RAM"
