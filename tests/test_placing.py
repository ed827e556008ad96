"""Placement's result written to replica rows, and replica tasks that must not undo it."""
from llmgw.models import EngineInstall, Model, Node, NodeEvent, Replica
from llmgw.services import placing
from llmgw.services.replicas import _set, spec_of
from tests.test_model_catalog import cli, fleet, sample, tiny  # noqa: F401  (fixtures)


def place_now():
    nodes, models, replicas, installs = placing.snapshot()
    placing.Applier(nodes, models, replicas, "18000-18100").apply(
        placing.plan(nodes, models, replicas, installs))


def test_a_replica_leaving_its_node_gets_a_new_generation_and_a_stale_task_cannot_undo_it(
        fleet, cli, tiny):
    cli("model", "add", "g", "--file", tiny, "--gpus", "1", "--gpu-class", "l4-24g")
    place_now()
    stale = Replica.get(Replica.name == "g-0")  # what a slow start task still holds
    assert stale.node.name == "gpu-b"
    cli("model", "set", "g", "--gpu-class", "h100-80g")
    place_now()
    rows = {r.name: (r.slot, r.generation, r.node.name, r.state, r.gpu_indexes)
            for r in Replica.select()}
    # The old engine finishes its requests while the new one starts: two unit names.
    assert rows == {"g-0": ("g-0", 0, "gpu-b", "stopping", [0]),
                    "g-0-g1": ("g-0", 1, "gpu-a", "pending", [0])}
    assert _set(stale, "starting", "started as llmgw-g-0") is False
    assert Replica.get(Replica.name == "g-0").state == "stopping"
    place_now()  # stable: nothing more is created, the leaving row's grace is not reset
    assert {r.name: r.state for r in Replica.select()} == {"g-0": "stopping", "g-0-g1": "pending"}
    said = [e.text for e in NodeEvent.select()]
    assert said == ["g-0 leaves: GPU 0 (GPU-5e7b0c90-2d4f-4a1e-8c3b-6f9d0a1b2c00) is l4-24g; the "
                    "model now needs h100-80g; g-0-g1 placed on gpu-a on GPU 0"]


def test_a_grown_share_is_written_so_the_engine_restarts_with_it(fleet, cli, tiny):
    cli("model", "add", "sh", "--file", tiny, "--share-gpu", "--min-gpu-memory", "4G",
        "--gpu-class", "l4-24g", "--replicas", "2")
    place_now()
    rows = {r.name: r for r in Replica.select()}
    assert [r.gpu_memory_mb for r in rows.values()] == [4096, 4096]
    install = EngineInstall.get(EngineInstall.engine == "llamacpp", EngineInstall.node == rows["sh-0"].node)
    before = spec_of(Model.get(Model.name == "sh"), install, rows["sh-0"])
    cli("model", "set", "sh", "--min-gpu-memory", "12G")
    place_now()
    after = {r.name: r for r in Replica.select()}
    assert [r.gpu_memory_mb for r in after.values()] == [12288, 12288]
    assert after["sh-0"].gpu_indexes != after["sh-1"].gpu_indexes  # 24 GiB cards: one each now
    assert spec_of(Model.get(Model.name == "sh"), install, after["sh-0"]) != before


def test_a_gpu_model_is_not_put_on_a_cpu_build_of_llamacpp(fleet, cli, tiny):
    EngineInstall.update(variant="cpu").execute()
    cli("model", "add", "g", "--file", tiny, "--gpus", "1")
    place_now()
    assert Replica.select().count() == 0
    summary = Model.get(Model.name == "g").verdict["summary"]
    assert "gpu-a: llamacpp there is the cpu build, which cannot use GPUs" in summary
    assert Node.select().count() == 3


def rows():
    return {r.name: (r.node.name, r.state) for r in Replica.select().order_by(Replica.name)}


def test_a_draining_replica_whose_slot_is_scaled_away_leaves_with_its_replacement(fleet, cli, tiny):
    cli("model", "add", "c", "--file", tiny, "--replicas", "2")
    place_now()
    first = rows()
    drained_node = first["c-1"][0]
    Node.update(state="draining").where(Node.name == drained_node).execute()
    place_now()
    assert rows()["c-1"] == (drained_node, "draining") and "c-1-g1" in rows()
    cli("model", "set", "c", "--replicas", "1")
    place_now()
    assert rows()["c-1"][1] == "stopping" and rows()["c-1-g1"][1] == "stopping"
    assert rows()["c-0"][1] != "stopping"  # the slot still wanted stays (draining, if on that node)


def test_a_row_told_to_leave_is_never_written_back_by_a_task_that_saw_it_leaving(fleet, cli, tiny):
    cli("model", "add", "c", "--file", tiny)
    place_now()
    row = Replica.get()
    Replica.update(state="stopping").execute()
    row.state = "stopping"  # what its task read
    assert _set(row, "failed", "ssh dropped while stopping it") is False
    assert _set(row, "ready", "it answered /health") is False
    assert Replica.get().state == "stopping"


def test_two_rows_filling_one_slot_keep_the_newest_generation(fleet, cli, tiny):
    cli("model", "add", "c", "--file", tiny)
    place_now()
    old = Replica.get()
    Replica.create(name="c-0-g3", slot="c-0", generation=3, model=old.model, node=old.node, port=2,
                   state="ready")
    place_now()
    assert {n: s for n, (_, s) in rows().items()} == {"c-0": "stopping", "c-0-g3": "ready"}


def test_a_model_that_cannot_be_placed_is_logged_once_per_change_not_once_per_pass(fleet, cli, tiny, caplog):
    import logging
    cli("model", "add", "huge", "--file", tiny, "--gpus", "1", "--gpu-class", "h100-80g", "--replicas", "9")
    with caplog.at_level(logging.WARNING, logger="llmgw.placing"):
        for _ in range(5):
            place_now()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model huge:")]
    assert len(said) == 1, said
    cli("model", "set", "huge", "--replicas", "10")
    with caplog.at_level(logging.WARNING, logger="llmgw.placing"):
        for _ in range(3):
            place_now()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("model huge:")]
    assert len(said) == 2, said
