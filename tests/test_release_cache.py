"""Release metadata and archives: asked once, downloaded once, verified, refused when wrong.

Against a local fake of GitHub's release API (the one boundary faked here, since GitHub
cannot be reached from a test machine).
"""
import io
import tarfile
import threading

import pytest

from llmgw.errors import ReleaseError
from llmgw.executors.release import ReleaseCache
from llmgw.executors import archive_read
from llmgw.facts import tarlist
from llmgw.plans import archive
from tests.harness.fake_github import FakeGitHub

REPO = "ggml-org/llama.cpp"


def tarball(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, kind, data in members:
            info = tarfile.TarInfo(name)
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o755
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture
def github():
    with FakeGitHub(redirect=True) as gh:
        yield gh


def cache_for(gh, tmp_path):
    return ReleaseCache(tmp_path / "cache", gh.base_url, gh.base_url)


def test_ten_nodes_cause_one_metadata_request_and_one_download(github, tmp_path):
    github.add_release("b1", {"a.tar.gz": tarball([("build/bin/llama-server", "file", b"x")])})
    cache = cache_for(github, tmp_path)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(cache.asset(REPO, "b1", "a.tar.gz")))
               for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and len(paths) == 10
    assert github.counts["metadata"] == 1
    assert github.counts["download"] == {"a.tar.gz": 1}


def test_a_wrong_digest_is_refused_and_nothing_is_kept(github, tmp_path):
    github.add_release("b2", {"a.tar.gz": b"payload"}, digests={"a.tar.gz": "sha256:" + "0" * 64})
    cache = cache_for(github, tmp_path)
    with pytest.raises(ReleaseError, match="does not match the sha256 checksum.*asked for again"):
        cache.asset(REPO, "b2", "a.tar.gz")
    assert not list((tmp_path / "cache").rglob("a.tar.gz*"))
    # The publisher corrects its checksum: the next try reads it and installs.
    github.add_release("b2", {"a.tar.gz": b"payload"})
    assert cache.asset(REPO, "b2", "a.tar.gz").read_bytes() == b"payload"


def test_an_asset_without_a_digest_is_not_installed_unchecked(github, tmp_path):
    github.add_release("b3", {"a.tar.gz": b"payload"}, digests={"a.tar.gz": ""})
    with pytest.raises(ReleaseError, match="publishes no sha256 for a.tar.gz"):
        cache_for(github, tmp_path).asset(REPO, "b3", "a.tar.gz")


def test_rate_limiting_is_reported_as_such(github, tmp_path):
    github.add_release("b4", {"a.tar.gz": b"payload"})
    github.rate_limit(True)
    with pytest.raises(ReleaseError, match="GitHub is rate-limiting this address"):
        cache_for(github, tmp_path).digests(REPO, "b4")


def test_an_unknown_release_names_the_setting(github, tmp_path):
    with pytest.raises(ReleaseError, match="has no release b999; check engines.llamacpp"):
        cache_for(github, tmp_path).digests(REPO, "b999")


def test_archives_with_escaping_paths_or_links_are_read_as_unsafe(tmp_path):
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(tarball([("build/bin/llama-server", "file", b"x"),
                             ("../../etc/cron.d/evil", "file", b"x"),
                             ("build/bin/libc.so", "symlink", "/lib/x86_64-linux-gnu/libc.so.6")]))
    assert archive.refusals(archive_read.tar_members(bad)) == [
        "../../etc/cron.d/evil would unpack outside the install directory",
        "build/bin/libc.so is a link to /lib/x86_64-linux-gnu/libc.so.6, outside the install directory"]


def test_a_model_url_is_fetched_once_and_held_to_its_checksum(github, tmp_path):
    import hashlib
    from llmgw.errors import InstallError
    from llmgw.services.weights import local_copy
    github.add_release("m", {"model.gguf": b"GGUF weights"})
    url = f"{github.base_url}/{REPO}/releases/download/m/model.gguf"
    good = hashlib.sha256(b"GGUF weights").hexdigest()
    first = local_copy(url, tmp_path / "cache", good)
    assert first.read_bytes() == b"GGUF weights" and local_copy(url, tmp_path / "cache", good) == first
    assert github.counts["download"] == {"model.gguf": 1}
    with pytest.raises(InstallError, match="the model model.gguf does not match the sha256 checksum"):
        local_copy(url, tmp_path / "other", "0" * 64)
    assert not list((tmp_path / "other").rglob("model.gguf*"))


def test_an_archive_past_the_member_or_size_bounds_is_refused_while_it_is_read(tmp_path):
    from llmgw.errors import InstallError
    many = tmp_path / "many.tar.gz"
    many.write_bytes(tarball([(f"f{i}", "file", b"") for i in range(30)]))
    assert len(archive_read.tar_members(many, max_members=30)) == 30
    with pytest.raises(InstallError, match="many.tar.gz was refused: it holds more than 20 members"):
        archive_read.tar_members(many, max_members=20)
    bomb = tmp_path / "bomb.tar.gz"  # 4 MiB of zeros: a few KiB compressed
    bomb.write_bytes(tarball([("build/bin/a", "file", bytes(2 << 20)), ("build/bin/b", "file", bytes(2 << 20))]))
    assert bomb.stat().st_size < 64 << 10
    with pytest.raises(InstallError, match=r"would unpack to more than 3,000,000 bytes \(4,194,304 listed"):
        archive_read.tar_members(bomb, max_bytes=3_000_000)
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"not an archive")
    with pytest.raises(InstallError, match="junk.tar.gz is not a readable .tar.gz archive"):
        archive_read.tar_members(junk)


def test_the_node_listing_is_bounded_and_read_by_columns_that_cannot_shift(tmp_path):
    import subprocess
    many = tmp_path / "many.tar.gz"
    many.write_bytes(tarball([(f"build/f{i}", "file", b"x" * i) for i in range(30)]))
    out = subprocess.run(tarlist.listing_argv(str(many), 5), capture_output=True, text=True, check=True).stdout
    assert len(out.splitlines()) == 6  # one past the bound: enough to refuse, no more
    assert archive.too_big(len(tarlist.parse_listing(out)), 0, max_members=5)
    whole = subprocess.run(tarlist.listing_argv(str(many), 100), capture_output=True, text=True).stdout
    assert tarlist.unpacked_bytes(whole) == sum(range(30))
    # Listed with owner names, one holding a space shifts every column after it: such a line
    # is not read for a name (which could hide '../') but refuses the archive.
    shifted = "-rw-r--r-- domain users/staff 12 2026-11-29 18:43 2026-11-29 ../../etc/x\n"
    members = tarlist.parse_listing(shifted)
    assert members[0][1] == "unreadable"
    assert archive.refusals(members) == [f"a line of its listing could not be read ({shifted.strip()!r})"]
