"""The demo run twice, as a person does: Ctrl-C stops it without a traceback and leaves no process
(engines included); the second run, on another --listen, keeps the key and the password."""
import os
import re
import signal
import subprocess
import sys
import threading

import pytest
import requests

from tests.conftest import TOP, free_port
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e


def ours(root):
    """Processes whose command line names the demo's root: gunicorn, the reconciler, engines."""
    ps = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout
    return [line.strip() for line in ps.splitlines() if str(root) in line]


def run_demo(root, port):
    """Start the demo, wait until its replica answers, press Ctrl-C; return (output, key, password)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LLMGW_ROOT", None)
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", "demo",
                             "--root", str(root), "--listen", f"127.0.0.1:{port}"], cwd=TOP, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        key = wait_for("the key line", lambda: next((m.group(1) for line in list(out)
                                                     if (m := re.match(r"export OPENAI_API_KEY=(\S+)", line))), None),
                       timeout=60, every=0.2)

        def answers():
            try:
                return requests.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=5,
                                     headers={"Authorization": f"Bearer {key}"},
                                     json={"model": "demo", "max_tokens": 1, "messages": []}).status_code == 200
            except requests.RequestException:
                return False
        wait_for("the demo's replica to answer", answers, timeout=90, every=0.3)
    finally:
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in its terminal sends to the whole group
        proc.wait(timeout=90)
        reader.join(timeout=10)
    text = "".join(out)
    password = re.search(r"with password (\S+)", text)
    return proc.returncode, text, key, password and password.group(1)


def test_ctrl_c_leaves_nothing_and_a_rerun_keeps_the_key_and_password(tmp_path):
    root = tmp_path / "root"
    first_port, second_port = free_port(), free_port()
    rc, text, key, password = run_demo(root, first_port)
    assert rc == 0, text[-3000:]
    assert "Traceback" not in text and "Exception" not in text, text[-3000:]
    assert "stopped llmgw-demo-0" in text
    wait_for("every process of the demo to be gone", lambda: not ours(root), timeout=30, every=0.2)
    assert password

    rc, again, key2, password2 = run_demo(root, second_port)  # another address, given on the rerun
    assert rc == 0 and "Traceback" not in again, again[-3000:]
    assert key2 == key and "kept" in re.search(r"api key .*", again).group(0)
    assert password2 == password and "kept from the last run" in again
    assert f"http://127.0.0.1:{second_port}/v1" in again
    wait_for("every process of the demo to be gone", lambda: not ours(root), timeout=30, every=0.2)
    print(f"first run and rerun each stopped cleanly; key {key[:14]}… and the password kept")
