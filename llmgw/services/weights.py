"""Model files: fetched once into the control plane's cache, pushed to each node that needs them."""
import asyncio
import hashlib
import json
import posixpath
import urllib.parse
from pathlib import Path

from ..errors import InstallError, LlmgwError
from ..facts import host as df
from ..executors.release import download_checked, sha256_file
from ..executors.transport import LONG_FILE_SECONDS
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


def manifest_of(directory):
    """Return ((relative path, bytes, sha256), ...) of every file under a model directory."""
    root = Path(directory)
    out = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".llmgw"):
            continue  # our own markers, never the model's
        out.append((rel, path.stat().st_size, sha256_file(path)))
    return tuple(out)


def manifest_digest(manifest):
    """Return the sha256 that names a directory model: the digest of its manifest."""
    text = json.dumps([list(e) for e in manifest], separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def remote_path(base_dir, model):
    """Return where the model's weights live on a node: a .gguf file, or a directory."""
    stem = f"{slug(model.name)}-{model.sha256[:12]}"
    if model.manifest:
        return posixpath.join(base_dir, "models", stem)
    return posixpath.join(base_dir, "models", f"{stem}.gguf")


# One copy of one model onto one node at a time: two replicas placed together share it.
copies = {}


async def ensure_on_node(transport, base_dir, model, cache_dir, reserve_mb=0, progress=None,
                         max_rate=0, node_tools=None):
    """Put the model's weights on the node unless an intact copy is there; return their path.

    reserve_mb: room the node's filesystem must keep free after the copy (weights.reserve).
    progress(done, total, sent, found): bytes of the whole copy, as it goes (total 0: unknown).
    node_tools: with weights.download_on_node, the node's download tools (curl, wget): a URL
    model with a known sha256 is then fetched by the node itself.
    """
    if not model.source:
        return ""
    if not model.sha256:
        local = await asyncio.to_thread(local_copy, model.source, cache_dir)
        model.sha256 = await asyncio.to_thread(sha256_file, local)
        model.save(only=[type(model).sha256])
    path = remote_path(base_dir, model)
    lock = copies.setdefault((transport.name, path), asyncio.Lock())
    async with lock:
        if model.manifest:
            return await _ensure_tree(transport, model, path, reserve_mb, progress, max_rate)
        if node_tools is not None and model.sha256 and check_source(model.source)[0] == "url":
            return await _download_on_node(transport, model, path, node_tools, progress)
        return await _ensure_file(transport, model, path, cache_dir, reserve_mb, progress, max_rate)


async def _download_on_node(transport, model, path, tools, progress):
    """Let the node fetch a URL model itself, continuing a .partial; check its sha256."""
    if await _sha256_on(transport, path) == model.sha256:
        return path
    part = path + ".partial"
    if "curl" in tools:
        argv = ["curl", "-fsSL", "--retry", "3", "-C", "-", "-o", part, model.source]
    elif "wget" in tools:
        argv = ["wget", "-q", "-c", "-O", part, model.source]
    else:
        raise InstallError("the node has neither curl nor wget to download the model with; install "
                           "one, or set weights.download_on_node = false to copy from the control plane")
    await transport.check(["mkdir", "-p", posixpath.dirname(path)])
    found = await _size_on(transport, part)
    watch = asyncio.create_task(_watch_download(transport, part, found, progress))
    try:
        fetched = await transport.run(argv, timeout=LONG_FILE_SECONDS)
    finally:
        watch.cancel()
    got = await _sha256_on(transport, part)
    if got != model.sha256:
        if fetched.ok:  # whole, and wrong: the next attempt starts afresh
            await transport.run(["rm", "-f", part])
            raise InstallError(f"{model.source} downloaded on the node does not match its sha256 "
                               f"(got {_short(got)}, expected {_short(model.sha256)})")
        raise InstallError(f"downloading {model.source} on the node failed (exit "
                           f"{fetched.exit_status}): {fetched.tail()}; what arrived is kept and "
                           f"continued on the next attempt")
    await transport.check(["mv", part, path], timeout=LONG_FILE_SECONDS)
    if progress is not None:
        size = await _size_on(transport, path)
        progress(size, size, size - found, found)
    return path


async def _watch_download(transport, part, found, progress):
    """Report a node-side download's size once a second (its total is not known here)."""
    while progress is not None:
        await asyncio.sleep(1)
        size = await _size_on(transport, part, found)
        progress(size, 0, size - found, found)


async def _ensure_file(transport, model, path, cache_dir, reserve_mb, progress, max_rate):
    if await _sha256_on(transport, path) == model.sha256:
        return path
    local = await asyncio.to_thread(local_copy, model.source, cache_dir, model.sha256)
    await transport.check(["mkdir", "-p", posixpath.dirname(path)])
    size = Path(local).stat().st_size
    found = await _size_on(transport, path + ".partial")
    await _check_room(transport, path, size - min(found, size), reserve_mb, model.name)
    tell = None if progress is None else (lambda done, total, sent: progress(done, total, sent, found))
    await transport.send(str(local), path + ".partial", tell, max_rate)
    got = await _sha256_on(transport, path + ".partial", must=True)
    if got != model.sha256:
        await transport.run(["rm", "-f", path + ".partial"])  # the next attempt starts afresh
        raise InstallError(f"{model.name}'s file arrived on the node damaged (sha256 "
                           f"{_short(got)}, expected {_short(model.sha256)})")
    await transport.check(["mv", path + ".partial", path], timeout=LONG_FILE_SECONDS)
    return path


MARKER = ".llmgw-manifest"  # written last into a tree whose every file was checked


async def _ensure_tree(transport, model, path, reserve_mb, progress, max_rate):
    """Copy a directory model into <path>.partial file by file, check each file's sha256
    against the manifest, then rename it into place; a copy cut short continues."""
    have = await transport.run(["cat", posixpath.join(path, MARKER)])
    if have.ok and have.stdout.strip() == model.sha256:
        return path
    stage = path + ".partial"
    files = [tuple(e) for e in model.manifest]
    source = Path(model.source)
    for rel, size, _ in files:
        if not (source / rel).is_file() or (source / rel).stat().st_size != size:
            raise InstallError(f"{source / rel} is missing or changed since {model.name} was added "
                               f"(the manifest says {size} bytes); add the model again with "
                               f"`flask llmgw model set {model.name} --file {source}`")
    present = await _present(transport, stage)
    total = sum(size for _, size, _ in files)
    found = sum(min(present.get(rel, 0), size) for rel, size, _ in files
                if present.get(rel, 0) <= size)
    await transport.check(["mkdir", "-p", stage,
                           *sorted({posixpath.join(stage, posixpath.dirname(rel))
                                    for rel, _, _ in files if posixpath.dirname(rel)})])
    await _check_room(transport, path, total - found, reserve_mb, model.name)
    before, sent_before = 0, 0
    for rel, size, _ in files:
        if present.get(rel) == size:
            before += size
            continue

        def tell(done, _total, sent, base=before, sent_base=sent_before):
            if progress is not None:
                progress(base + done, total, sent_base + sent, found)
        sent, _ = await transport.send(str(source / rel), posixpath.join(stage, rel), tell, max_rate)
        before, sent_before = before + size, sent_before + sent
    if progress is not None:
        progress(total, total, sent_before, found)
    await _check_tree(transport, model, stage, files)
    await transport.check(["sh", "-c", 'printf %s "$2" > "$0/$3" && rm -rf "$1" && mv "$0" "$1"',
                           stage, path, model.sha256, MARKER], timeout=LONG_FILE_SECONDS,
                          what=f"moving {model.name}'s checked tree into place")
    return path


async def _check_tree(transport, model, stage, files):
    """Hash every file of a copied tree on the node; remove the ones that do not match."""
    argv = ["sh", "-c", 'cd "$0" && sha256sum -- "$@"', stage, *[rel for rel, _, _ in files]]
    hashed = await transport.run(argv, timeout=LONG_FILE_SECONDS)
    got = {}
    for line in hashed.stdout.splitlines():
        digest, _, name = line.partition("  ")
        got[name] = digest
    bad = [rel for rel, _, sha in files if got.get(rel) != sha]
    if bad:
        await transport.run(["sh", "-c", 'cd "$0" && rm -f -- "$@"', stage, *bad])
        raise InstallError(f"{len(bad)} file(s) of {model.name} arrived damaged or not at all "
                           f"({', '.join(bad[:3])}{' …' if len(bad) > 3 else ''}); they were "
                           f"removed and are copied again on the next attempt")


async def _sha256_on(transport, path, must=False):
    """Return the sha256 of a file on the node, or '' when it cannot be read (must: raise)."""
    argv = ["sha256sum", path]
    done = await (transport.check(argv, timeout=LONG_FILE_SECONDS) if must
                  else transport.run(argv, timeout=LONG_FILE_SECONDS))
    return (done.stdout.split() or [""])[0] if done.ok else ""


async def _size_on(transport, path, missing=0):
    """Return the size of one file on the node, or `missing` when it is not there."""
    done = await transport.run(["stat", "-c", "%s", path])
    size = done.stdout.strip()
    return int(size) if done.ok and size.isdigit() else missing


def _short(digest):
    return f"{digest[:12]}…" if digest else "?…"


async def _present(transport, directory):
    """Return {relative path: bytes} of the files under a directory on the node ({} if none)."""
    listing = await transport.run(["find", directory, "-type", "f", "-printf", "%s %P\\n"],
                                  timeout=LONG_FILE_SECONDS)
    out = {}
    for line in listing.stdout.splitlines() if listing.ok else []:
        size, _, rel = line.partition(" ")
        if size.isdigit():
            out[rel] = int(size)
    return out


async def check_on_node(transport, model, node_name):
    """Return the model's path when it is on the node, as --node-path promised; never copied,
    never deleted. A file's sha256 is checked when one was given."""
    directory = model.engine in ("vllm", "sglang")
    probe = ["test", "-f", posixpath.join(model.source, "config.json") if directory else model.source]
    if not (await transport.run(probe)).ok:
        what = "a directory with config.json" if directory else "a file"
        raise InstallError(f"{model.source} is not {what} on {node_name}; the model was added with "
                           f"--node-path, so put it at that path on every node it may run on "
                           f"(shared storage or a copy), or add it from a file on the control plane")
    if model.sha256 and not directory:
        got = await _sha256_on(transport, model.source)
        if got != model.sha256:
            raise InstallError(f"{model.source} on {node_name} is not the file given with --sha256 "
                               f"(sha256 {_short(got)}, expected {_short(model.sha256)})")
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
        raise InstallError(f"{model_name}'s weights ({size / 2**30:.1f} GiB still to copy) do not fit on "
                           f"{room.get('mount') or directory}: {free_mb / 1024:.1f} GiB free, "
                           f"{need_mb / 1024:.1f} GiB needed with weights.reserve "
                           f"({reserve_mb / 1024:.1f} GiB kept free); free space there or lower "
                           f"weights.reserve")

