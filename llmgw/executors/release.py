"""Release metadata and archives from a GitHub-shaped API, fetched once and cached.

A fleet behind one NAT shares GitHub's sixty unauthenticated requests an hour, so
the control plane asks once per release and downloads each archive once; nodes
get the file pushed from the cache.
"""
import hashlib
import json
import os
import threading
from pathlib import Path

import requests

from ..errors import ReleaseError

_locks = {}
_locks_guard = threading.Lock()


def _lock(key):
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


class ReleaseCache:
    """Fetches a release's digests and assets into cache_dir, verifying every byte."""

    def __init__(self, cache_dir, api_base, download_base, timeout=60):
        self.cache = Path(cache_dir)
        self.api = api_base.rstrip("/")
        self.download_base = download_base.rstrip("/")
        self.timeout = timeout

    def _dir(self, repo, tag):
        d = self.cache / "releases" / repo.replace("/", "_") / tag
        d.mkdir(parents=True, exist_ok=True)
        return d

    def digests(self, repo, tag):
        """Return {asset name: sha256 hex} as published for repo@tag (one request per tag, and
        one more after a download that did not match: see forget)."""
        meta = self._dir(repo, tag) / "release.json"
        with _lock(str(meta)):
            if not meta.exists():
                data = self._fetch_metadata(repo, tag)
                tmp = meta.with_suffix(".tmp")
                tmp.write_text(json.dumps(data))
                tmp.replace(meta)
            data = json.loads(meta.read_text())
        out = {}
        for asset in data.get("assets", []):
            digest = asset.get("digest") or ""
            if digest.startswith("sha256:") and len(digest) == 71:
                out[asset["name"]] = digest[7:]
        return out

    def _fetch_metadata(self, repo, tag):
        url = f"{self.api}/repos/{repo}/releases/tags/{tag}"
        try:
            resp = requests.get(url, timeout=self.timeout,
                                headers={"Accept": "application/vnd.github+json"})
        except requests.RequestException as e:
            raise ReleaseError(f"cannot reach {self.api} for {repo} {tag}: {e}") from e
        if resp.status_code == 404:
            raise ReleaseError(f"{repo} has no release {tag}; check engines.llamacpp in the config")
        if resp.status_code in (403, 429):
            raise ReleaseError(f"GitHub is rate-limiting this address ({resp.status_code}: "
                               f"{_message(resp)}); llmgw retries later, or set "
                               f"engines.github_api to a mirror")
        if resp.status_code != 200:
            raise ReleaseError(f"{url} answered {resp.status_code}: {_message(resp)}")
        try:
            return resp.json()
        except ValueError as e:
            raise ReleaseError(f"{url} did not answer JSON: {e}") from e

    def digest(self, repo, tag, name):
        """Return the published sha256 of one asset, refusing an asset published without one."""
        want = self.digests(repo, tag).get(name)
        if not want:
            raise ReleaseError(f"{repo} {tag} publishes no sha256 for {name}, so it cannot be "
                               f"verified and is not installed")
        return want

    def url(self, repo, tag, name):
        """Return where an asset is downloaded from."""
        return f"{self.download_base}/{repo}/releases/download/{tag}/{name}"

    def asset(self, repo, tag, name, progress=lambda text: None):
        """Return the local path of a verified asset, downloading it on first use."""
        want = self.digest(repo, tag, name)
        path = self._dir(repo, tag) / name
        with _lock(str(path)):
            if path.exists() and sha256_file(path) == want:
                return path
            try:
                self._download(repo, tag, name, path, want, progress)
            except ReleaseError as e:
                if getattr(e, "mismatch", False):
                    self.forget(repo, tag)
                    raise ReleaseError(f"{e}; the release's checksums are asked for again on the "
                                       f"next try, in case they were what was wrong") from e
                raise
        return path

    def forget(self, repo, tag):
        """Drop the cached metadata of repo@tag: a published checksum that did not match what
        was downloaded may have been corrected since, and must not be trusted for ever."""
        meta = self._dir(repo, tag) / "release.json"
        with _lock(str(meta)):
            meta.unlink(missing_ok=True)

    def _download(self, repo, tag, name, path, want, progress):
        download_checked(self.url(repo, tag, name), path, want, self.timeout, name,
                         "its publisher gave", ReleaseError, progress, "it was not installed")


def download_checked(url, target, want, timeout, what, whose, error, progress=None,
                     outcome="it was not kept"):
    """Download url into target, hashing as it arrives; keep it only when it matches want.

    Written to target.partial first and renamed, so a cut-off or wrong download never lies in
    the cache. want '' accepts any content. Returns the sha256 of what was kept.
    """
    part = target.with_name(target.name + ".partial")
    h = hashlib.sha256()
    try:
        with requests.get(url, stream=True, timeout=timeout) as resp:
            if resp.status_code != 200:
                raise error(f"downloading {what} failed: {url} answered {resp.status_code}")
            size = int(resp.headers.get("Content-Length") or 0)
            if progress:
                progress(f"downloading {what}" + (f" ({size >> 20} MB)" if size else ""))
            with open(part, "wb") as f:
                for chunk in resp.iter_content(1 << 20):
                    f.write(chunk)
                    h.update(chunk)
    except requests.RequestException as e:
        part.unlink(missing_ok=True)
        raise error(f"downloading {what} from {url} failed: {e}") from e
    got = h.hexdigest()
    if want and got != want:
        part.unlink(missing_ok=True)
        refused = error(f"{what} does not match the sha256 checksum {whose} "
                        f"(got {got[:12]}…, expected {want[:12]}…); {outcome}")
        refused.mismatch = True
        raise refused
    os.replace(part, target)
    return got


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _message(resp):
    try:
        return resp.json().get("message", "")[:200]
    except ValueError:
        return resp.text[:200]
