"""End-to-end self-check of the llama-server fixtures (not a pytest file):

    cached release tarball (llama_build) -> FakeGitHub release API -> download with requests,
    sha256 against the asset's "digest" -> unpack in a temp dir -> llama-server on the tiny
    GGUF (tiny_gguf) -> official `openai` client: chat, streamed chat -> a second start with
    `--embeddings --pooling mean` -> an embedding.

    python3 tests/harness/selfcheck_llama.py [--cache DIR]

Prints timings and a JSON summary; exits non-zero on the first failure.
`LlamaServer` and `free_port` are importable for tests.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fake_github import FakeGitHub  # noqa: E402
from llama_build import (ASSET_NAME, RELEASE_TAG, TOP_DIR, build_info,  # noqa: E402
                         extract_tarball, llama_server_tarball)
from tiny_gguf import write_tiny_gguf  # noqa: E402

REPO = "ggml-org/llama.cpp"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaServer:
    """Start llama-server on 127.0.0.1:<free port>; wait for /health 200; stop on exit."""

    def __init__(self, exe: Path, model: Path, extra: list[str] | None = None,
                 log: Path | None = None):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.argv = [str(exe), "-m", str(model), "--host", "127.0.0.1",
                     "--port", str(self.port), "-t", "1", "-tb", "1", "-c", "2048",
                     *(extra or [])]
        self.log = log or Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.healthy_after = None

    def __enter__(self) -> "LlamaServer":
        import requests

        t0 = time.monotonic()
        self._logf = open(self.log, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=self._logf, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = t0 + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}:\n"
                                   + self.log.read_text(errors="replace")[-3000:])
            try:
                if requests.get(self.base_url + "/health", timeout=1).status_code == 200:
                    self.healthy_after = time.monotonic() - t0
                    return self
            except requests.ConnectionError:
                pass
            time.sleep(0.01)
        self.__exit__()
        raise RuntimeError("llama-server not healthy within 60 s")

    def __exit__(self, *exc) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._logf.close()


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)
    print(f"  ok  {what}")


def _readable(text: str) -> bool:
    return bool(text) and all(32 <= ord(c) < 127 or c in "\n\t" for c in text)


def download_release_asset(api: str, tag: str, asset: str, dest: Path) -> Path:
    """What an installer does: release JSON -> asset URL + digest -> download -> verify."""
    import requests

    r = requests.get(f"{api}/repos/{REPO}/releases/tags/{tag}",
                     headers={"Accept": "application/vnd.github+json"}, timeout=10)
    r.raise_for_status()
    meta = next(a for a in r.json()["assets"] if a["name"] == asset)
    h = hashlib.sha256()
    with requests.get(meta["browser_download_url"], stream=True, timeout=30) as d:
        d.raise_for_status()
        with open(dest, "wb") as f:
            for chunk in d.iter_content(1 << 16):
                h.update(chunk)
                f.write(chunk)
    algo, want = meta["digest"].split(":", 1)
    if algo != "sha256" or h.hexdigest() != want:
        dest.unlink()
        raise ValueError(f"digest mismatch for {asset}: got sha256:{h.hexdigest()}, "
                         f"release says {meta['digest']}")
    return dest


def main(argv: list[str] | None = None) -> int:
    import requests
    from openai import OpenAI

    ap = argparse.ArgumentParser()
    ap.add_argument("--cache", type=Path, default=None)
    args = ap.parse_args(argv)
    summary: dict = {}

    t0 = time.monotonic()
    tarball = llama_server_tarball(args.cache)
    info = build_info(args.cache)
    summary.update(tarball=str(tarball), tarball_size=tarball.stat().st_size,
                   build_seconds=info["build_seconds"], version=info["version_output"],
                   cache_lookup_s=round(time.monotonic() - t0, 3))
    print(f"tarball {tarball} ({summary['tarball_size']} bytes)")

    with tempfile.TemporaryDirectory(prefix="llama-selfcheck-") as tmp_s:
        tmp = Path(tmp_s)
        print("fake GitHub + download")
        with FakeGitHub(REPO, redirect=True) as gh:
            gh.add_release(RELEASE_TAG, {ASSET_NAME: tarball, "bad.tar.gz": b"x" * 10},
                           digests={"bad.tar.gz": "sha256:" + "0" * 64})
            got = download_release_asset(gh.base_url, RELEASE_TAG, ASSET_NAME,
                                         tmp / ASSET_NAME)
            _check(got.stat().st_size == tarball.stat().st_size, "asset downloaded, sha256 ok")
            try:
                download_release_asset(gh.base_url, RELEASE_TAG, "bad.tar.gz", tmp / "bad")
                _check(False, "wrong digest rejected")
            except ValueError:
                _check(True, "wrong digest rejected")
            r = requests.get(f"{gh.base_url}/repos/{REPO}/releases/tags/b1", timeout=5)
            _check(r.status_code == 404 and r.json()["message"] == "Not Found",
                   "unknown tag -> 404")
            gh.rate_limit(True)
            r = requests.get(f"{gh.base_url}/repos/{REPO}/releases/tags/{RELEASE_TAG}")
            _check(r.status_code == 403 and r.headers["x-ratelimit-remaining"] == "0",
                   "rate limit -> 403, x-ratelimit-remaining: 0")
            _check(gh.counts["metadata"] == 4
                   and gh.counts["download"] == {ASSET_NAME: 1, "bad.tar.gz": 1},
                   f"counts {gh.counts}")

        print("unpack + tiny model")
        inst = tmp / "opt"
        inst.mkdir()
        extract_tarball(got, inst, "tar")
        exe = inst / TOP_DIR / "llama-server"
        _check(os.access(exe, os.X_OK), f"{exe.relative_to(tmp)} executable")
        model = write_tiny_gguf(tmp / "tiny.gguf")
        summary["gguf_size"] = model.stat().st_size

        print("llama-server (chat)")
        with LlamaServer(exe, model, log=tmp / "chat.log") as srv:
            summary["argv_chat"] = [Path(a).name if "/" in a else a for a in srv.argv]
            summary["healthy_after_s"] = round(srv.healthy_after, 3)
            client = OpenAI(base_url=srv.base_url + "/v1", api_key="anything")
            models = client.models.list()
            _check(len(models.data) >= 1, f"/v1/models: {models.data[0].id}")
            t = time.monotonic()
            resp = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Say hello"}],
                max_tokens=24, temperature=0)
            summary["chat_s"] = round(time.monotonic() - t, 3)
            text = resp.choices[0].message.content
            _check(_readable(text), f"chat reply readable: {text!r}")
            summary["chat_finish_reason"] = resp.choices[0].finish_reason
            summary["chat_usage"] = resp.usage.model_dump() if resp.usage else None
            t = time.monotonic()
            first = None
            parts = []
            finish = None
            stream = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "Count"}],
                max_tokens=24, temperature=0, stream=True,
                stream_options={"include_usage": True})
            for chunk in stream:
                if chunk.choices:
                    delta = chunk.choices[0].delta.content
                    if delta:
                        first = first or time.monotonic() - t
                        parts.append(delta)
                    finish = chunk.choices[0].finish_reason or finish
            summary["stream_first_token_s"] = round(first or -1, 4)
            summary["stream_total_s"] = round(time.monotonic() - t, 3)
            summary["stream_chunks"] = len(parts)
            _check(_readable("".join(parts)) and finish == "length",
                   f"streamed reply readable, finish={finish}: {''.join(parts)!r}")

        print("llama-server (--embeddings --pooling mean)")
        with LlamaServer(exe, model, ["--embeddings", "--pooling", "mean"],
                         log=tmp / "emb.log") as srv:
            summary["argv_embeddings"] = [Path(a).name if "/" in a else a for a in srv.argv]
            summary["healthy_after_embeddings_s"] = round(srv.healthy_after, 3)
            client = OpenAI(base_url=srv.base_url + "/v1", api_key="anything")
            emb = client.embeddings.create(model="tiny", input=["hello world", "bye"])
            dim = len(emb.data[0].embedding)
            _check(len(emb.data) == 2 and dim == 64, f"2 embeddings of dim {dim}")
            resp = client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
            _check(_readable(resp.choices[0].message.content), "chat still works")

    summary["total_s"] = round(time.monotonic() - t0, 2)
    print(json.dumps(summary, indent=2))
    print("SELFCHECK OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
