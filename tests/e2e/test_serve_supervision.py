"""`flask llmgw serve` keeps the gateway up when its reconciler dies, and starts it again."""
import os
import signal
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.e2e.conftest import ControlPlane, cli, wait_for

pytestmark = pytest.mark.e2e


def reconciler_child(pid):
    """Return the pid of serve's `flask llmgw reconcile` child, or None."""
    for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"reconcile" in argv:
            return int(child)
    return None


def test_the_gateway_keeps_serving_while_its_killed_reconciler_comes_back(tmp_path):
    root, port = tmp_path / "cp", free_port()
    cli(root, "init", "--listen", f"127.0.0.1:{port}")
    key = cli(root, "keys", "create", "--project", "default").stdout.strip()
    plane = ControlPlane(root, port)
    plane.start()
    try:
        first = wait_for("serve's reconciler", lambda: reconciler_child(plane.proc.pid), timeout=60, every=0.2)
        os.kill(first, signal.SIGKILL)
        models = requests.get(plane.url + "/v1/models", headers={"Authorization": f"Bearer {key}"},
                              timeout=10)
        assert models.status_code == 200  # the gateway never went down with it
        second = wait_for("a new reconciler", lambda: (reconciler_child(plane.proc.pid) or first) != first
                          and reconciler_child(plane.proc.pid), timeout=60, every=0.2)
        assert second != first
        assert plane.proc.poll() is None
        log = (root / "serve.log").read_text()
        assert f"the reconciler (pid {first}) exited with status -9" in log
        assert "the gateway keeps serving" in log
    finally:
        plane.stop()
    assert not Path(f"/proc/{second}").exists()  # stopped with serve, not left behind
