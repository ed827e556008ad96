"""Collecting weights nobody uses: the pure plan, and on a local node with real files."""
import asyncio
import json
import os
import re
import time

from llmgw.executors.transport import LocalTransport
from llmgw.models import Model, Node, NodeEvent, Replica
from llmgw.plans import weights_gc
from llmgw.plans.weights_gc import Entry
from llmgw.services import collect, nodes, weights
from tests.harness.tiny_gguf import write_tiny_gguf
from tests.test_model_catalog import cli  # noqa: F401  (fixture)

NOW = 1_800_000_000


def verdicts(entries, users=None, seen=None, keep=3600):
    return {v.entry.name: (v.collect, v.why) for v in weights_gc.plan(entries, users or {}, seen or {}, NOW, keep)}


def test_in_use_and_being_copied_are_kept_unused_past_keep_is_collected():
    got = verdicts([Entry("a-1234.gguf", 10, NOW - 90000), Entry("b-5678.gguf", 10, NOW - 90000),
                    Entry("b-5678.gguf.partial", 5, NOW - 90000), Entry("c-9abc", 10, NOW - 100),
                    Entry("d-0000.gguf", 10, NOW - 90000), Entry(".llmgw-upload", 0, NOW - 90000)],
                   users={"b-5678.gguf": ["b-0"]}, seen={"d-0000.gguf": NOW - 60})
    assert got == {
        "a-1234.gguf": (True, "unused for 90000 s (weights.keep_unused is 3600 s)"),
        "b-5678.gguf": (False, "in use by b-0"),
        "b-5678.gguf.partial": (False, "in use by b-0"),
        "c-9abc": (False, "unused for 100 s; collected after 3600 s"),
        "d-0000.gguf": (False, "unused for 60 s; collected after 3600 s"),  # used a minute ago
        ".llmgw-upload": (False, "not a name llmgw gives weights; left alone")}


def test_keep_unused_zero_never_collects():
    assert verdicts([Entry("a.gguf", 1, 0)], keep=0) == {
        "a.gguf": (False, "unused; weights.keep_unused is 0, so kept")}


def test_a_listing_line_that_does_not_parse_is_never_a_candidate():
    assert weights_gc.parse_listing("12\t1700000000.5\ta.gguf\nbad line\nx\t1\tb\n") == \
        [Entry("a.gguf", 12, 1700000000.5)]


def test_a_node_s_unused_weight_goes_and_one_in_use_and_one_beside_models_stay(app, root, tmp_path, cli):
    with open(root / "server.toml", "a") as toml:
        toml.write('\n[weights]\nkeep_unused = "30m"\n')
    node = asyncio.run(nodes.add_local_node("local", str(tmp_path / "node")))
    tiny = write_tiny_gguf(tmp_path / "tiny.gguf")
    t = LocalTransport()
    used = Model.create(name="used", source=str(tiny), sha256=weights.sha256_file(tiny))
    asyncio.run(weights.ensure_on_node(t, node.base_dir, used, str(tmp_path / "c"), 0))
    Replica.create(name="used-0", slot="used-0", model=used, node=node, port=1, state="ready")
    models = tmp_path / "node" / "models"
    old = models / "gone-0123456789ab.gguf"
    old.write_bytes(b"x" * 1000)
    hour_ago = time.time() - 3600
    os.utime(old, (hour_ago, hour_ago))
    os.utime(models / os.listdir(models)[0], (hour_ago, hour_ago))
    beside = tmp_path / "node" / "keep-me.gguf"
    beside.write_bytes(b"y")
    out = cli("weights", "local", "--json")
    rows = {r["name"]: r for r in json.loads(out.output)}
    assert rows["gone-0123456789ab.gguf"]["collectable"] and rows["gone-0123456789ab.gguf"]["bytes"] == 1000
    mine = next(n for n in rows if n.startswith("used-"))
    assert rows[mine]["in_use_by"] == ["used-0"] and not rows[mine]["collectable"]
    assert not any(r["collected"] for r in rows.values())  # listing alone deletes nothing
    out = cli("weights", "local", "--collect")
    assert out.exit_code == 0 and re.search(r"^gone-0123456789ab\.gguf .* collected ", out.output, re.M), out.output
    assert sorted(os.listdir(models)) == [mine] and beside.exists()
    said = [e.text for e in NodeEvent.select().where(NodeEvent.node == node)]
    assert said[-1].startswith("collected gone-0123456789ab.gguf (1.00 kB): no replica here used it for ")
    # Unused once its replica is gone, but used a moment ago: kept until keep_unused passes.
    Replica.delete().execute()
    rows = {r["name"]: r for r in json.loads(cli("weights", "local", "--json").output)}
    assert rows[mine]["why"].startswith("unused for 0 s; collected after 1800 s")
    assert Node.get().weights_seen[mine] > hour_ago


def test_node_path_weights_under_models_are_never_collected(app, tmp_path):
    node = asyncio.run(nodes.add_local_node("local", str(tmp_path / "node")))
    shared = tmp_path / "node" / "models" / "shared-qwen"
    shared.mkdir(parents=True)
    (shared / "config.json").write_text("{}")
    Model.create(name="np", engine="vllm", source=str(shared), on_nodes=True, gpus=1)
    long_ago = time.time() - 10 * 86400
    os.utime(shared, (long_ago, long_ago))
    (verdict,) = asyncio.run(collect.look(node, LocalTransport(), 60))
    assert (verdict.entry.name, verdict.collect, verdict.why) == \
        ("shared-qwen", False, "in use by np (--node-path)")
