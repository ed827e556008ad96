"""The model catalog from the command line and from server.toml: needs, changes, refusals."""
import json
from pathlib import Path

import pytest

from llmgw import config
from llmgw.cli import llmgw
from llmgw.errors import ConfigError
from llmgw.facts import gpu
from llmgw.models import EngineInstall, Model, Node
from llmgw.services import catalog
from tests.harness.tiny_gguf import write_tiny_gguf

CASES = Path(__file__).parent / "cases" / "gpus"


def sample(name):
    return gpu.parse_gpus(json.loads((CASES / f"{name}.json").read_text())["output"])


@pytest.fixture
def fleet(app):
    """Three discovered nodes in the database: 8×H100 (GPU 3 with ECC errors), 4×L4, CPU only."""
    for name, gpus in (("gpu-a", sample("h100x8-one-ecc")), ("gpu-b", sample("l4x4")), ("cpu-c", [])):
        node = Node.create(name=name, addr="10.0.0.1", reachable=True,
                           facts={"gpus": gpus, "memory": {"total_mb": 65536}})
        EngineInstall.create(node=node, engine="llamacpp", version="b1", state="ready")
    return app


@pytest.fixture
def cli(runner, root):
    def run(*args):
        return runner.invoke(llmgw, [*args, "--root", str(root)])
    return run


@pytest.fixture
def tiny(tmp_path):
    return str(write_tiny_gguf(tmp_path / "tiny.gguf"))


def test_a_model_says_what_it_needs_and_the_catalog_keeps_it(fleet, cli, tiny):
    out = cli("model", "add", "big", "--file", tiny, "--gpus", "2", "--gpu-class", "h100-80g",
              "--min-gpu-memory", "40G", "--memory", "12G", "--context", "2048", "--require",
              "pool=prod", "--max-per-node", "1", "--replicas", "2")
    assert out.exit_code == 0, out.output
    assert "added model big: 2 replica(s) of llamacpp, 2 × h100-80g each" in out.output
    m = Model.get(Model.name == "big")
    assert (m.gpus, m.gpu_classes, m.min_gpu_memory_mb, m.memory_mb, m.context) == \
        (2, ["h100-80g"], 40960, 12288, 2048)
    assert (m.requires, m.max_per_node, m.share_gpu, m.origin) == ({"pool": "prod"}, 1, False, "")
    assert m.estimate["context"] == 2048 and m.estimate["format"] == "gguf"
    # No node carries pool=prod, and the command says so before the reconciler runs.
    assert "lacks label pool=prod" in out.output


def test_model_set_changes_only_what_is_given(fleet, cli, tiny):
    cli("model", "add", "qwen", "--file", tiny, "--gpus", "1", "--gpu-class", "l4-24g")
    before = Model.get(Model.name == "qwen")
    out = cli("model", "set", "qwen", "--replicas", "4")
    assert out.exit_code == 0, out.output
    after = Model.get(Model.name == "qwen")
    assert after.replicas == 4
    assert (after.source, after.sha256, after.gpus, after.gpu_classes) == \
        (before.source, before.sha256, 1, ["l4-24g"])
    nothing = cli("model", "set", "qwen")
    assert nothing.exit_code != 0 and "nothing to change" in nothing.output


def test_models_and_show_list_needs_as_json(fleet, cli, tiny):
    cli("model", "add", "small", "--file", tiny, "--memory", "2G", "--replicas", "2")
    listed = json.loads(cli("models", "--json").output)
    assert [m["name"] for m in listed] == ["small"]
    assert listed[0]["needs"].startswith("2 replica(s) of llamacpp, CPU only, 2048 MiB RAM")
    shown = json.loads(cli("model", "show", "small", "--json").output)
    assert shown["memory_mb"] == 2048 and shown["origin"] == "cli"
    assert cli("model", "show", "nope").exit_code != 0


def test_remove_refuses_while_a_fallback_names_it_unless_forced(fleet, cli, tiny):
    cli("model", "add", "base", "--file", tiny)
    cli("model", "add", "front", "--file", tiny, "--fallback", "base")
    refused = cli("model", "remove", "base")
    assert refused.exit_code != 0 and "front name(s) 'base' as a fallback" in refused.output
    assert Model.get_or_none(Model.name == "base") is not None
    forced = cli("model", "remove", "base", "--force")
    assert forced.exit_code == 0, forced.output
    assert Model.get_or_none(Model.name == "base") is None
    assert Model.get(Model.name == "front").fallbacks is None


@pytest.mark.parametrize("flags,words", [
    (["--gpus", "1", "--gpu-class", "h900-80g"], "'h900-80g' is neither in this cluster (it has: h100-80g, l4-24g)"),
    (["--gpus", "1", "--gpu-class", "H100"], "'h100' is not a GPU class"),
    (["--gpus", "16"], "--gpus 16: no node has that many GPU cards; the most on one node is 8 (gpu-a)"),
    (["--gpus", "5", "--gpu-class", "l4-24g"], "the most on one node is 4 (gpu-b)"),
    (["--require", "pool=$(reboot)"], "'pool=$(reboot)' is not KEY=VALUE"),
    (["--require", "pool"], "'pool' is not KEY=VALUE"),
    (["--gpus", "1", "--min-gpu-memory", "40"], "'40' is not a size with a unit; write e.g. 40G"),
    (["--memory", "-1G"], "--memory '-1G' is negative"),
    (["--gpu-class", "l4-24g"], "but --gpus is 0"),
    (["--gpus", "2", "--share-gpu"], "cannot go with --gpus 2"),
    (["--replicas", "65"], "--replicas 65 is out of range"),
    (["--arg=--api-key", "--arg=x"], "--arg=--api-key: llmgw starts each replica's engine with a key of its own"),
    (["--arg=--api-key-file=/k"], "--arg=--api-key-file: llmgw starts each replica's engine"),
])
def test_bad_settings_are_refused_by_name_and_nothing_is_written(fleet, cli, tiny, flags, words):
    out = cli("model", "add", "m", "--file", tiny, *flags)
    assert out.exit_code != 0
    assert words in out.output
    assert "Traceback" not in out.output
    assert Model.select().count() == 0


def test_a_file_that_is_not_gguf_and_a_vllm_model_without_a_directory_are_refused(fleet, cli, tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_text("not a model at all\n")
    out = cli("model", "add", "m", "--file", str(bogus))
    assert out.exit_code != 0 and "is not a GGUF file" in out.output
    out = cli("model", "add", "v", "--engine", "vllm", "--file", str(bogus), "--gpus", "1")
    assert out.exit_code != 0 and "serves a directory with config.json" in out.output
    out = cli("model", "add", "v", "--engine", "vllm", "--gpus", "1")
    assert out.exit_code != 0 and "--file is required for a vllm model" in out.output
    out = cli("model", "add", "v", "--engine", "vllm", "--file", "models/qwen", "--on-nodes", "--gpus", "1")
    assert out.exit_code != 0 and "absolute path on the nodes" in out.output
    assert Model.select().count() == 0


def test_a_vllm_directory_on_the_nodes_is_taken_as_it_is(fleet, cli):
    out = cli("model", "add", "v", "--engine", "vllm", "--file", "/srv/models/qwen", "--on-nodes",
              "--gpus", "2", "--gpu-class", "l4-24g")
    assert out.exit_code == 0, out.output
    assert "not on this machine, so it is not sized" in out.output
    assert Model.get(Model.name == "v").on_nodes


def test_cards_too_small_for_the_estimate_warn_but_add(fleet, cli, tiny):
    out = cli("model", "add", "tight", "--file", tiny, "--gpus", "1", "--share-gpu",
              "--min-gpu-memory", "1M")
    assert out.exit_code == 0, out.output
    assert "warning: the estimate is" in out.output and "more than the 1 MiB share" in out.output


def test_model_plan_sizes_a_gguf_and_names_the_classes_that_hold_it(fleet, cli, tiny):
    out = cli("model", "plan", "--file", tiny, "--context", "1024")
    assert out.exit_code == 0, out.output
    assert "KV cache" in out.output and "1024 tokens" in out.output
    assert "h100-80g: 1 card" in out.output and "l4-24g: 1 card" in out.output
    assert cli("model", "plan").exit_code != 0


def test_explain_gives_every_node_a_verdict(fleet, cli, tiny):
    cli("model", "add", "tp4", "--file", tiny, "--gpus", "4", "--gpu-class", "h100-80g", "--replicas", "2")
    out = json.loads(cli("explain", "tp4", "--json").output)
    nodes = {n["node"]: n for n in out["nodes"]}
    assert nodes["gpu-b"]["reason"] == "has l4-24g, needs h100-80g"
    assert nodes["cpu-c"]["reason"] == "no GPU, 4 × h100-80g needed"
    # Explained as the reconciler will place it: one replica on four cards, no room for two.
    assert nodes["gpu-a"]["reason"].startswith(
        "runs tp4-0 on GPU 0, 1, 2, 4; no more: 3 of 7 healthy h100-80g free, 4 needed; GPU 3 (")
    assert "is unhealthy: 12 uncorrected ECC errors" in nodes["gpu-a"]["reason"]
    assert out["summary"].startswith("1 of 2 replicas placed; no node can run the rest")
    text = cli("explain", "tp4").output
    assert "gpu-b" in text and "has l4-24g, needs h100-80g" in text


def write_models(root, text):
    path = root / "server.toml"
    path.write_text(path.read_text() + text if path.exists() else text)


def test_declared_models_follow_the_file_and_refuse_other_changes(fleet, cli, root, tiny):
    write_models(root, f'[models.decl]\nfile = "{tiny}"\nreplicas = 2\nmemory = "1G"\n'
                       f'require = {{ pool = "prod" }}\n')
    conf = config.load(str(root))
    said = catalog.sync_declared(conf)
    assert said == [f"decl: declared from {conf['_path']}"]
    m = Model.get(Model.name == "decl")
    assert (m.origin, m.replicas, m.memory_mb, m.requires) == ("file", 2, 1024, {"pool": "prod"})
    assert catalog.sync_declared(conf) == []  # unchanged: nothing written, nothing hashed
    refused = cli("model", "set", "decl", "--replicas", "3")
    assert refused.exit_code != 0
    assert f"declared in {conf['_path']} ([models.decl]); change it there" in refused.output
    assert cli("model", "remove", "decl").exit_code != 0
    (root / "server.toml").write_text("")
    assert catalog.sync_declared(config.load(str(root))) == \
        [f"decl: removed, it is no longer in {conf['_path']}"]
    assert Model.get_or_none(Model.name == "decl") is None


@pytest.mark.parametrize("table,words", [
    ('[models.x]\nfile = "/m.gguf"\ngpus = "two"\n', "[models.x]: gpus = 'two' must be a whole number"),
    ('[models.x]\nfile = "/m.gguf"\nmemory = "12"\n', "memory '12' is not a size with a unit"),
    ('[models.x]\nfile = "/m.gguf"\ncolour = "red"\n', "unknown key 'colour'"),
    ('[models.x]\nfile = "/m.gguf"\nrequire = { pool = "a b" }\n', "require 'pool=a b' is not KEY=VALUE"),
])
def test_a_bad_declared_model_stops_the_config_from_loading(root, table, words):
    (root / "server.toml").write_text(table)
    with pytest.raises(ConfigError) as e:
        config.load(str(root))
    assert words in str(e.value) and "server.toml" in str(e.value)


def test_model_set_does_not_hash_the_file_again_unless_file_is_given(fleet, cli, tiny):
    cli("model", "add", "m", "--file", tiny)
    sha = Model.get(Model.name == "m").sha256
    with open(tiny, "ab") as f:  # changed in place, behind the catalog's back
        f.write(b"\0" * 32)
    out = cli("model", "set", "m", "--replicas", "2", "--memory", "1G")
    assert out.exit_code == 0, out.output
    assert (Model.get(Model.name == "m").sha256, Model.get(Model.name == "m").replicas) == (sha, 2)
    again = cli("model", "set", "m", "--file", tiny)
    assert again.exit_code == 0, again.output
    assert Model.get(Model.name == "m").sha256 not in ("", sha)


def test_model_set_works_when_the_file_is_gone_from_here_and_keeps_the_estimate(fleet, cli, tiny):
    cli("model", "add", "m", "--file", tiny)
    before = Model.get(Model.name == "m")
    Path(tiny).unlink()
    out = cli("model", "set", "m", "--replicas", "3")
    assert out.exit_code == 0, out.output
    after = Model.get(Model.name == "m")
    assert (after.replicas, after.sha256, after.estimate) == (3, before.sha256, before.estimate)
    assert "--file" not in out.output.split("warning:")[0]


def test_vllm_without_cards_is_refused(fleet, cli):
    out = cli("model", "add", "v", "--engine", "vllm", "--file", "/srv/m", "--on-nodes")
    assert out.exit_code != 0 and "vllm serves on GPUs here: give --gpus N" in out.output


def test_offload_args_on_a_model_without_cards_warn_that_it_sees_no_gpu(fleet, cli, tiny):
    out = cli("model", "add", "m", "--file", tiny, "--arg=-ngl", "--arg=99")
    assert out.exit_code == 0, out.output
    assert "asks llama.cpp to offload layers, but the model claims no GPU" in out.output
    clash = cli("model", "set", "m", "--arg=-t", "--no-args")
    assert clash.exit_code != 0 and "--no-args removes what the same command also sets" in clash.output
