"""The end-to-end cluster: real sshd nodes, a fake GitHub serving a real llama-server, the CLI."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from tests.conftest import TOP

VERSION = "b10991"          # the default in llmgw.config, so the test exercises it
BAD_VERSION = "b10990"      # published with a wrong digest
CACHE = Path(os.environ.get("LLMGW_TEST_CACHE", Path.home() / ".cache" / "llmgw-test"))


def cli(root, *args, check=True, timeout=300):
    """Run `flask llmgw ARGS --root ROOT` as an operator would; return the completed process."""
    env = dict(os.environ)
    env.pop("LLMGW_ROOT", None)
    env.pop("SSH_AUTH_SOCK", None)  # the tests say which agent, if any, is used
    result = subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw",
                             *args, "--root", str(root)], cwd=TOP, env=env, capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"flask llmgw {' '.join(args)} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result


def need_test_nodes():
    """Skip, with the reason, where real test nodes cannot run (not root, no sshd, ...)."""
    from tests.harness import nodes as harness
    reason = harness.require_root_reason()
    if reason:
        pytest.skip(reason)


def operator_key(work):
    """Make the operator's own SSH key; return (private key path, public key line)."""
    path = work / "operator_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path, path.with_suffix(".pub").read_text().strip()


def tune(root, section, **values):
    """Add keys to one [section] of a control plane's server.toml."""
    lines = "".join(f"\n{k} = {v!r}" if isinstance(v, str) else f"\n{k} = {str(v).lower()}"
                    for k, v in values.items())
    text = (root / "server.toml").read_text().replace(f"[{section}]", f"[{section}]{lines}", 1)
    (root / "server.toml").write_text(text)


def nodes_json(root):
    return {n["name"]: n for n in json.loads(cli(root, "nodes", "--json").stdout)}


def configure(root, github, interval=1, llamacpp=VERSION, listen=None):
    """Point a fresh control plane at the fake GitHub and make it quick."""
    text = (root / "server.toml").read_text()
    text = text.replace(f'llamacpp = "{VERSION}"', f'llamacpp = "{llamacpp}"\n'
                        f'github_api = "{github.base_url}"\ngithub_download = "{github.base_url}"')
    text = text.replace("interval = 5", f"interval = {interval}")
    if listen:
        text = text.replace('listen = "127.0.0.1:8080"', f'listen = "{listen}"')
    # The test nodes' disks are this machine's: the default 5G reserve would make the suite
    # depend on how full it happens to be.
    text += '\n[weights]\nreserve = "64M"\n'
    (root / "server.toml").write_text(text)


def wait_for(what, check, timeout=240, every=1.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def fire_streams(urls, key, n=50):
    """n concurrent streamed chats of 10 tokens, dealt round the gateway URLs in turn; return
    [(index of the URL, status, body)]."""
    import concurrent.futures

    def one(i):
        r = requests.post(urls[i % len(urls)] + "/v1/chat/completions", stream=True, timeout=60,
                          headers={"Authorization": f"Bearer {key}"},
                          json={"model": "demo", "max_tokens": 10, "stream": True,
                                "messages": [{"role": "user", "content": "go"}]})
        return i % len(urls), r.status_code, r.content.decode()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def stop_served(proc, root):
    """Stop a `flask llmgw serve|demo` started in its own session, and its local node's engines."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass  # a test stopped it already
    proc.wait(timeout=60)
    for pidfile in (root / "node" / "run").glob("llmgw-*.pid"):
        try:
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        except (ProcessLookupError, ValueError):
            pass


class ControlPlane:
    """`flask llmgw serve` in its own process group, so it can be killed and started again."""

    def __init__(self, root, port):
        self.root, self.port, self.proc = root, port, None
        self.url = f"http://127.0.0.1:{port}"

    def start(self):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("LLMGW_ROOT", None)
        self.log = open(self.root / "serve.log", "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app",
                                      "llmgw", "serve", "--root", str(self.root)], cwd=TOP, env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for("the web server", lambda: self._health(), timeout=60, every=0.2)

    def _health(self):
        try:
            return requests.get(self.url + "/health", timeout=1).status_code == 200
        except requests.RequestException:
            return False

    def stop(self, sig=signal.SIGTERM):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            self.proc.wait(timeout=60)
        self.proc = None
