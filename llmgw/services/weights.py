"""Model files: fetched once into the control plane's cache, pushed to each node that needs them."""
import asyncio
import hashlib
import posixpath
import urllib.parse
from pathlib import Path

from ..errors import InstallError, LlmgwError
from ..facts import host as df
from ..executors.release import download_checked, sha256_file
from ..executors.ssh import LONG_FILE_SECONDS
from ..plans.placement import slug


def check_source(source):
    """Return (kind, normalised source) for a path on this machine or an http(s) URL."""
    parsed = urllib.parse.urlparse(source)
    if parsed.scheme in ("http", "https"):
        return "url", source
    path = Path(source).expanduser().resolve()
    if not path.is_file():
        raise LlmgwError(f"--file {source}: no such file on this machine; give a GGUF path or an "
                         f"http(s) URL.")
    return "path", str(path)


def local_copy(source, cache_dir, sha256=""):
    """Return a local path holding the model file (downloading a URL once into the cache)."""
    kind, where = check_source(source)
    if kind == "path":
        return Path(where)
    name = posixpath.basename(urllib.parse.urlparse(where).path) or "model.gguf"
    target = Path(cache_dir) / "models" / hashlib.sha256(where.encode()).hexdigest()[:16] / name
    if target.exists() and (not sha256 or sha256_file(target) == sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    download_checked(where, target, sha256, 60, f"the model {name}", "given with --sha256",
                     InstallError)
    return target


def remote_path(base_dir, model):
    return posixpath.join(base_dir, "models", f"{slug(model.name)}-{model.sha256[:12]}.gguf")


async def ensure_on_node(transport, base_dir, model, cache_dir, reserve_mb=0):
    """Put the model's file on the node unless an intact copy is already there; return its path.

    reserve_mb: room the node's filesystem must keep free after the copy (weights.reserve).
    """
    if not model.source:
        return ""
    if not model.sha256:
        local = await asyncio.to_thread(local_copy, model.source, cache_dir)
        model.sha256 = await asyncio.to_thread(sha256_file, local)
        model.save(only=[type(model).sha256])
    path = remote_path(base_dir, model)
    have = await transport.run(["sha256sum", path], timeout=LONG_FILE_SECONDS)
    if have.ok and have.stdout.split()[:1] == [model.sha256]:
        return path
    local = await asyncio.to_thread(local_copy, model.source, cache_dir, model.sha256)
    await transport.check(["mkdir", "-p", posixpath.dirname(path)])
    await _check_room(transport, path, Path(local).stat().st_size, reserve_mb, model.name)
    await transport.put(str(local), path + ".partial")
    hashed = await transport.check(["sha256sum", path + ".partial"], timeout=LONG_FILE_SECONDS)
    got = hashed.stdout.split()[:1]
    if got != [model.sha256]:
        raise InstallError(f"{model.name}'s file arrived on the node damaged (sha256 "
                           f"{(got or ['?'])[0][:12]}…, expected {model.sha256[:12]}…)")
    await transport.check(["mv", path + ".partial", path], timeout=LONG_FILE_SECONDS)
    return path


async def check_on_node(transport, model, node_name):
    """Return the model's path when it is already on the node, as --on-nodes promised."""
    directory = model.engine in ("vllm", "sglang")
    probe = ["test", "-f", posixpath.join(model.source, "config.json") if directory else model.source]
    if not (await transport.run(probe)).ok:
        what = "a directory with config.json" if directory else "a file"
        raise InstallError(f"{model.source} is not {what} on {node_name}; the model was added with "
                           f"--on-nodes, so put it at that path on every node it may run on "
                           f"(shared storage or a copy), or add it from a file on the control plane")
    return model.source


async def _check_room(transport, path, size, reserve_mb, model_name):
    """Refuse a copy that would leave the node's filesystem with less than the reserve free.

    A half-copied file on a full disk helps nobody and can take the node's other services down.
    """
    directory = posixpath.dirname(path)
    room = df.parse_df((await transport.check(["df", "-Pk", directory])).stdout.splitlines()[1:])
    free_mb = room.get("free_mb")
    need_mb = -(-size // (1024 * 1024)) + reserve_mb
    if free_mb is not None and free_mb < need_mb:
        raise InstallError(f"{model_name}'s file ({size / 2**30:.1f} GiB) does not fit on "
                           f"{room.get('mount') or directory}: {free_mb / 1024:.1f} GiB free, "
                           f"{need_mb / 1024:.1f} GiB needed with weights.reserve "
                           f"({reserve_mb / 1024:.1f} GiB kept free); free space there or lower "
                           f"weights.reserve")

