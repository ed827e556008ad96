"""A local fake of the GitHub release API, enough for an installer that fetches release assets.

    with FakeGitHub() as gh:                     # repo "ggml-org/llama.cpp"
        gh.add_release("b10991", {"llama-b10991-bin-ubuntu-x64.tar.gz": tarball_path})
        requests.get(f"{gh.base_url}/repos/ggml-org/llama.cpp/releases/tags/b10991").json()
        requests.get(f"{gh.base_url}/ggml-org/llama.cpp/releases/download/b10991/<asset>")

Routes (stdlib http.server in a thread, 127.0.0.1, a free port):
  GET /repos/<owner>/<repo>/releases/tags/<tag>        release JSON (assets carry
                                                       "digest": "sha256:<hex>") or 404
  GET /repos/<owner>/<repo>/releases/latest            the last release added
  GET /<owner>/<repo>/releases/download/<tag>/<asset>  the bytes, or with redirect=True a
                                                       302 to /_blobs/<tag>/<asset> (as
                                                       GitHub redirects to its blob host)
`rate_limit(True)` answers every API and download request 403 with GitHub's rate-limit
body and headers. `counts` records what was asked: {"metadata": n, "download": {asset: n}}.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

RATE_LIMIT_BODY = {
    "message": "API rate limit exceeded for 127.0.0.1. (But here's the good news: "
    "Authenticated requests get a higher rate limit. Check out the documentation "
    "for more details.)",
    "documentation_url": "https://docs.github.com/rest/overview/resources-in-the-rest-api"
    "#rate-limiting",
}


class _Asset:
    def __init__(self, name: str, source: bytes | Path, digest: str | None):
        self.name = name
        self.source = source
        if isinstance(source, (bytes, bytearray)):
            self.size = len(source)
            real = hashlib.sha256(source).hexdigest()
        else:
            self.size = Path(source).stat().st_size
            h = hashlib.sha256()
            with open(source, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            real = h.hexdigest()
        self.digest = digest if digest is not None else "sha256:" + real

    def open(self):
        if isinstance(self.source, (bytes, bytearray)):
            import io

            return io.BytesIO(self.source)
        return open(self.source, "rb")


class FakeGitHub:
    def __init__(self, repo: str = "ggml-org/llama.cpp", redirect: bool = False,
                 host: str = "127.0.0.1"):
        self.repo = repo
        self.host = host  # a test node's bridge address, for nodes that download themselves
        self.redirect = redirect
        self.releases: dict[str, dict[str, _Asset]] = {}
        self._order: list[str] = []
        self._rate_limited = False
        self._lock = threading.Lock()
        self.counts: dict = {"metadata": 0, "download": {}}
        self.requests: list[tuple[str, str, dict]] = []  # (method, path, headers)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.base_url = ""

    # -- configuration -------------------------------------------------------------------
    def add_release(self, tag: str, assets: dict[str, bytes | Path],
                    digests: dict[str, str] | None = None) -> dict:
        digests = digests or {}
        with self._lock:
            self.releases[tag] = {n: _Asset(n, s, digests.get(n)) for n, s in assets.items()}
            if tag in self._order:
                self._order.remove(tag)
            self._order.append(tag)
        return self.release_json(tag)

    def rate_limit(self, on: bool) -> None:
        self._rate_limited = on

    def release_json(self, tag: str) -> dict:
        assets = self.releases[tag]
        rid = 1000 + self._order.index(tag)
        return {
            "url": f"{self.base_url}/repos/{self.repo}/releases/{rid}",
            "html_url": f"{self.base_url}/{self.repo}/releases/tag/{tag}",
            "id": rid,
            "tag_name": tag,
            "name": tag,
            "draft": False,
            "prerelease": False,
            "created_at": "2025-01-01T00:00:00Z",
            "published_at": "2025-01-01T00:00:00Z",
            "assets": [
                {
                    "url": f"{self.base_url}/repos/{self.repo}/releases/assets/{rid * 100 + i}",
                    "id": rid * 100 + i,
                    "name": a.name,
                    "label": "",
                    "content_type": "application/octet-stream",
                    "state": "uploaded",
                    "size": a.size,
                    "digest": a.digest,
                    "download_count": 0,
                    "browser_download_url":
                        f"{self.base_url}/{self.repo}/releases/download/{tag}/{a.name}",
                }
                for i, a in enumerate(assets.values())
            ],
        }

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> "FakeGitHub":
        fake = self

        class Handler(_Handler):
            gh = fake

        self._server = ThreadingHTTPServer((self.host, 0), Handler)
        self._server.daemon_threads = True
        self.base_url = f"http://{self.host}:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever,
                                        name="fake-github", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "FakeGitHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    gh: FakeGitHub
    protocol_version = "HTTP/1.1"
    server_version = "FakeGitHub/1.0"

    def log_message(self, fmt, *args):  # keep test output quiet
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json; charset=utf-8",
              headers: dict | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers=headers)

    def _not_found(self) -> None:
        self._json(404, {"message": "Not Found",
                         "documentation_url": "https://docs.github.com/rest",
                         "status": "404"})

    def _rate_limited(self) -> None:
        reset = int(time.time()) + 3600
        self._json(403, RATE_LIMIT_BODY, headers={
            "x-ratelimit-limit": "60",
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": str(reset),
            "x-ratelimit-used": "60",
            "x-ratelimit-resource": "core",
        })

    def _rate_headers(self) -> dict:
        return {"x-ratelimit-limit": "60", "x-ratelimit-remaining": "59",
                "x-ratelimit-reset": str(int(time.time()) + 3600),
                "x-ratelimit-resource": "core"}

    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        gh = self.gh
        path = unquote(urlsplit(self.path).path)
        gh.requests.append((self.command, path, dict(self.headers)))
        parts = [p for p in path.split("/") if p]
        owner_repo = gh.repo.split("/")

        # /repos/<owner>/<repo>/releases/tags/<tag>  and  .../releases/latest
        if len(parts) >= 4 and parts[0] == "repos" and parts[3] == "releases":
            with gh._lock:
                gh.counts["metadata"] += 1
            if gh._rate_limited:
                return self._rate_limited()
            if parts[1:3] != owner_repo:
                return self._not_found()
            if len(parts) == 6 and parts[4] == "tags" and parts[5] in gh.releases:
                return self._json(200, gh.release_json(parts[5]), self._rate_headers())
            if len(parts) == 5 and parts[4] == "latest" and gh._order:
                return self._json(200, gh.release_json(gh._order[-1]), self._rate_headers())
            return self._not_found()

        # /<owner>/<repo>/releases/download/<tag>/<asset>
        if len(parts) == 6 and parts[2:4] == ["releases", "download"]:
            tag, name = parts[4], parts[5]
            with gh._lock:
                gh.counts["download"][name] = gh.counts["download"].get(name, 0) + 1
            if gh._rate_limited:
                return self._rate_limited()
            if parts[0:2] != owner_repo or name not in gh.releases.get(tag, {}):
                return self._send(404, b"Not Found", "text/plain; charset=utf-8")
            if gh.redirect:
                self.send_response(302)
                self.send_header("Location", f"{gh.base_url}/_blobs/{tag}/{name}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return None
            return self._send_asset(gh.releases[tag][name])

        # /_blobs/<tag>/<asset>: where redirect mode points (GitHub's objects host)
        if len(parts) == 3 and parts[0] == "_blobs":
            asset = gh.releases.get(parts[1], {}).get(parts[2])
            if asset is None:
                return self._send(404, b"Not Found", "text/plain; charset=utf-8")
            return self._send_asset(asset)

        return self._not_found()

    def _send_asset(self, asset: _Asset) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(asset.size))
        self.send_header("Content-Disposition", f"attachment; filename={asset.name}")
        self.end_headers()
        if self.command == "HEAD":
            return
        with asset.open() as f:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                try:
                    self.wfile.write(chunk)
                except (BrokenPipeError, ConnectionResetError):
                    return
