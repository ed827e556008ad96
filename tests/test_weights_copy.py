"""Weights copied onto a node: resumed where a copy stopped, a directory checked file by file
against its manifest, progress as it goes. On this machine through the local transport (the
SFTP one is exercised by the end-to-end tests against real sshd nodes)."""
import asyncio
import os

import pytest

from llmgw.errors import InstallError
from llmgw.executors.transport import LocalTransport
from llmgw.models import Model
from llmgw.services import weights


def blob(path, size, seed=1):
    path.parent.mkdir(parents=True, exist_ok=True)
    data = bytes((i * seed + i // 7) % 251 for i in range(size))
    path.write_bytes(data)
    return data


def test_a_copy_cut_short_continues_where_it_stopped(tmp_path):
    data = blob(tmp_path / "src.bin", 20 * 2**20 + 123)
    (tmp_path / "dst.bin").write_bytes(data[:12 * 2**20])  # what a killed copy left
    seen = []
    sent, found = asyncio.run(LocalTransport().send(str(tmp_path / "src.bin"), str(tmp_path / "dst.bin"),
                                                    lambda *a: seen.append(a)))
    # Its last window (8 MiB, written in any order, so maybe with a hole) is written again.
    assert (sent, found) == (len(data) - 4 * 2**20, 4 * 2**20)
    assert (tmp_path / "dst.bin").read_bytes() == data
    assert seen[0] == (4 * 2**20, len(data), 0) and seen[-1] == (len(data), len(data), sent)


def test_a_hole_left_in_the_last_window_is_filled(tmp_path):
    data = blob(tmp_path / "src.bin", 10 * 2**20)
    left = bytearray(data[:9 * 2**20])
    left[5 * 2**20:6 * 2**20] = bytes(2**20)  # a block of the last window never landed
    (tmp_path / "dst.bin").write_bytes(bytes(left))
    asyncio.run(LocalTransport().send(str(tmp_path / "src.bin"), str(tmp_path / "dst.bin")))
    assert (tmp_path / "dst.bin").read_bytes() == data


def test_a_leftover_longer_than_the_file_is_not_trusted(tmp_path):
    data = blob(tmp_path / "src.bin", 3000)
    (tmp_path / "dst.bin").write_bytes(b"x" * 5000)
    assert asyncio.run(LocalTransport().send(str(tmp_path / "src.bin"), str(tmp_path / "dst.bin"))) == (3000, 0)
    assert (tmp_path / "dst.bin").read_bytes() == data


@pytest.fixture
def tree_model(app, tmp_path):
    src = tmp_path / "vl"
    blob(src / "config.json", 40)
    blob(src / "tokenizer.json", 3000, 3)
    blob(src / "shards" / "model-00001-of-00002.safetensors", 3 * 2**20, 5)
    blob(src / "shards" / "model-00002-of-00002.safetensors", 2 * 2**20 + 9, 7)
    manifest = weights.manifest_of(src)
    return Model.create(name="vl", engine="vllm", source=str(src), gpus=1,
                        sha256=weights.manifest_digest(manifest), manifest=[list(e) for e in manifest])


def ensure(model, base, progress=None):
    return asyncio.run(weights.ensure_on_node(LocalTransport(), str(base), model, "", 0, progress))


def test_a_directory_arrives_checked_and_a_second_look_copies_nothing(tree_model, tmp_path):
    calls = []
    path = ensure(tree_model, tmp_path / "node", lambda *a: calls.append(a))
    assert path == str(tmp_path / "node" / "models" / f"vl-{tree_model.sha256[:12]}")
    for rel, size, _ in tree_model.manifest:
        assert (tmp_path / "node" / "models" / path / rel).read_bytes() == \
            (tmp_path / "vl" / rel).read_bytes()
    total = sum(e[1] for e in tree_model.manifest)
    assert calls[-1] == (total, total, total, 0)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)  # done only rises
    calls.clear()
    assert ensure(tree_model, tmp_path / "node", lambda *a: calls.append(a)) == path
    assert calls == []


def test_a_directory_copy_resumes_file_by_file(tree_model, tmp_path):
    stage = tmp_path / "node" / "models" / f"vl-{tree_model.sha256[:12]}.partial"
    first = tmp_path / "vl" / "shards" / "model-00001-of-00002.safetensors"
    (stage / "shards").mkdir(parents=True)
    (stage / "config.json").write_bytes((tmp_path / "vl" / "config.json").read_bytes())
    (stage / "shards" / first.name).write_bytes(first.read_bytes()[:2**20])
    calls = []
    ensure(tree_model, tmp_path / "node", lambda *a: calls.append(a))
    total = sum(e[1] for e in tree_model.manifest)
    done, _, sent, found = calls[-1]
    # config.json was whole and is kept; the shard's first MiB lies in its last window and is
    # written again with the rest.
    assert found == 40 + 2**20 and sent == total - 40 and done == total


def test_a_damaged_file_is_named_removed_and_copied_again(tree_model, tmp_path):
    stage = tmp_path / "node" / "models" / f"vl-{tree_model.sha256[:12]}.partial"
    stage.mkdir(parents=True)
    (stage / "tokenizer.json").write_bytes(b"!" * 3000)  # whole-sized, wrong bytes: a bad leftover
    with pytest.raises(InstallError, match=r"1 file\(s\) of vl arrived damaged or not at all "
                                           r"\(tokenizer.json\); they were removed"):
        ensure(tree_model, tmp_path / "node")
    assert not (stage / "tokenizer.json").exists() and (stage / "config.json").exists()
    calls = []
    ensure(tree_model, tmp_path / "node", lambda *a: calls.append(a))
    assert calls[-1][2] == 3000  # only the damaged file was sent again


def test_a_source_file_changed_since_it_was_added_is_refused(tree_model, tmp_path):
    blob(tmp_path / "vl" / "tokenizer.json", 10)
    with pytest.raises(InstallError, match=r"tokenizer.json is missing or changed since vl was "
                                           r"added \(the manifest says 3000 bytes\)"):
        ensure(tree_model, tmp_path / "node")
    assert not os.path.exists(tmp_path / "node" / "models")
