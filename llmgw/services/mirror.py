"""The control plane's cache as the fleet's mirror: files fetched once, resumably, verified.

An entry is <cache>/mirror/NAME with NAME.json beside it (url, sha256, bytes, when); a fetch
under way or cut short is NAME.partial, which the next fetch continues with an HTTP Range
request. A model added with --file mirror:NAME copies from the entry to its nodes.
"""
import datetime
import json
import os
import re
import time
import urllib.parse
from pathlib import Path

import requests
import urllib3

from ..errors import LlmgwError
from ..executors.release import sha256_file
from ..models import Model

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
RETRIES = 5  # a connection that breaks mid-way is resumed this many times in one fetch


def root(conf):
    # Resolved: models store the resolved path of their file, and are matched against it.
    return (Path(conf["engines"]["cache"]) / "mirror").resolve()


def check_name(name):
    if not NAME.match(name or "") or name.endswith((".json", ".partial")):
        raise LlmgwError(f"mirror name {name!r} must be letters, digits and ._- (not starting with "
                         f"a dot, not ending in .json or .partial), e.g. qwen2.5-7b-q4.gguf; give "
                         f"--name.")
    return name


def path_of(conf, name):
    """Return the file of a complete mirror entry, or raise naming what is there."""
    check_name(name)
    path = root(conf) / name
    if not (root(conf) / f"{name}.json").is_file() or not path.is_file():
        have = ", ".join(e["name"] for e in entries(conf)) or "none yet"
        raise LlmgwError(f"no mirrored file called {name!r} (mirror: {have}); fetch it with "
                         f"`flask llmgw mirror fetch URL --name {name}`.")
    return path


def entries(conf):
    """Return every entry, complete or being fetched, with the models that use it."""
    base = root(conf)
    if not base.is_dir():
        return []
    users = {}
    for m in Model.select(Model.name, Model.source):
        users.setdefault(m.source, []).append(m.name)
    out = []
    for meta in sorted(base.glob("*.json")):
        info = json.loads(meta.read_text())
        info["state"] = "complete"
        info["in_use_by"] = sorted(users.get(str(base / info["name"]), []))
        out.append(info)
    done = {e["name"] for e in out}
    for part in sorted(base.glob("*.partial")):
        name = part.name[:-len(".partial")]
        if name not in done:
            out.append({"name": name, "url": "", "sha256": "", "bytes": part.stat().st_size,
                        "state": "fetching or stopped", "in_use_by": []})
    return out


def remove(conf, name):
    """Delete an entry no model uses; return a sentence."""
    path = path_of(conf, name)
    users = [m.name for m in Model.select(Model.name).where(Model.source == str(path))]
    if users:
        raise LlmgwError(f"{name} is used by model(s) {', '.join(users)}; remove or change them "
                         f"first (`flask llmgw model set MODEL --file …`).")
    size = path.stat().st_size
    path.unlink()
    (root(conf) / f"{name}.json").unlink(missing_ok=True)
    return f"removed {name} from the mirror ({size} bytes freed)"


def fetch(conf, url, name="", sha256="", progress=None, said=print):
    """Fetch url into the mirror, continuing a .partial; verify; return the entry's dict.

    progress(done, total) as bytes arrive; said(sentence) for resumes. A connection that
    breaks is resumed up to RETRIES times; a 4xx/5xx, a wrong sha256 or a full disk ends it
    with a sentence (a wrong file is deleted, a cut one kept to be continued).
    """
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise LlmgwError(f"{url!r} is not an http(s) URL; give one such as "
                         f"https://huggingface.co/…/model.gguf.")
    name = check_name(name or Path(parsed.path).name)
    sha256 = sha256.strip().lower()
    if sha256 and not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise LlmgwError(f"--sha256 {sha256!r} is not 64 hex digits.")
    base = root(conf)
    base.mkdir(parents=True, exist_ok=True)
    target, part, meta = base / name, base / f"{name}.partial", base / f"{name}.json"
    if meta.is_file() and target.is_file():
        info = json.loads(meta.read_text())
        if info.get("url") == url and (not sha256 or info.get("sha256") == sha256):
            return dict(info, already=True)
        raise LlmgwError(f"{name} is mirrored already from {info.get('url')}; give another --name "
                         f"or `flask llmgw mirror remove {name}` first.")
    for attempt in range(RETRIES + 1):
        try:
            total = _get(url, part, progress)
            break
        except _Broken as e:
            if attempt == RETRIES:
                raise LlmgwError(f"fetching {url} broke {RETRIES + 1} times ({e}); {part.stat().st_size} "
                                 f"bytes are kept in {part}: run the same command again to "
                                 f"continue.") from e
            said(f"the connection broke at {part.stat().st_size} bytes ({e}); continuing")
            time.sleep(min(2 ** attempt, 10) * 0.5)
    got = sha256_file(part)
    if sha256 and got != sha256:
        part.unlink()
        raise LlmgwError(f"{url} does not match --sha256 (got {got[:12]}…, expected {sha256[:12]}…); "
                         f"the file was deleted, nothing was mirrored.")
    os.replace(part, target)
    info = {"name": name, "url": url, "sha256": got, "bytes": total,
            "fetched": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    meta.write_text(json.dumps(info, indent=1))
    return info


class _Broken(Exception):
    """The connection broke mid-way: worth continuing."""


def _get(url, part, progress):
    have = part.stat().st_size if part.exists() else 0
    # The file's own bytes, never a compressed form of them: offsets count those.
    headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={have}-"} if have else {})}
    try:
        with requests.get(url, headers=headers, stream=True, timeout=60) as resp:
            if resp.status_code == 416 and have:
                return have  # it was whole already: the hash decides
            if resp.status_code not in (200, 206):
                raise LlmgwError(f"GET {url} answered {resp.status_code} {resp.reason}; check the "
                                 f"URL (nothing was mirrored).")
            if resp.status_code == 200:
                have = 0  # the server sends it all again: start over
            total = have + int(resp.headers.get("Content-Length") or 0)
            with open(part, "ab" if have else "wb") as f:
                done = have
                if progress:
                    progress(done, total)
                # read1: what has arrived, so a connection cut mid-way loses nothing it brought.
                for chunk in iter(lambda: resp.raw.read1(1 << 16), b""):
                    try:
                        f.write(chunk)
                    except OSError as e:
                        raise LlmgwError(f"writing {part} failed after {done} bytes: {e.strerror}; "
                                         f"free space there and run the same command again to "
                                         f"continue.") from e
                    done += len(chunk)
                    if progress:
                        progress(done, total)
            if resp.headers.get("Content-Length") and done < total:
                raise _Broken(f"{done} of {total} bytes arrived")
            return done
    except (requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
            requests.Timeout, urllib3.exceptions.HTTPError) as e:
        raise _Broken(str(e) or type(e).__name__) from e
