"""The README's demo, as a person would use it: start it, log in with a browser, watch logs move."""
import os
import re
import subprocess
import sys
import time

import openai
import pytest

from tests.conftest import TOP, free_port
from tests.e2e.conftest import stop_served
from tests.harness import browser

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("demo") / "root"
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LLMGW_ROOT", None)
    proc = subprocess.Popen([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw",
                             "demo", "--root", str(root), "--listen", f"127.0.0.1:{port}"],
                            cwd=TOP, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            out.append(line)
            if "llmgw serving on" in line:
                break
        text = "".join(out)
        assert "llmgw serving on" in text, text
        info = {"url": re.search(r"OPENAI_BASE_URL=(\S+)", text).group(1),
                "key": re.search(r"OPENAI_API_KEY=(\S+)", text).group(1),
                "password": re.search(r"with password (\S+)", text).group(1), "root": root}
        client = openai.OpenAI(base_url=info["url"], api_key=info["key"], max_retries=0, timeout=10)
        deadline = time.monotonic() + 60
        while True:
            try:
                client.chat.completions.create(model="demo", messages=[{"role": "user", "content": "hi"}])
                break
            except (openai.APIStatusError, openai.APIConnectionError):
                assert time.monotonic() < deadline, "the demo's replica never became ready"
                time.sleep(0.5)
        info["client"] = client
    except BaseException:
        stop_served(proc, root)  # a demo that never came up must not outlive the test
        raise
    yield info
    stop_served(proc, root)



def test_the_demo_answers_the_official_client_streamed_and_not(demo):
    client = demo["client"]
    reply = client.chat.completions.create(model="demo", max_tokens=3,
                                           messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "this is a"
    chunks = list(client.chat.completions.create(model="demo", max_tokens=3, stream=True,
                                                 messages=[{"role": "user", "content": "hi"}]))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "this is a"
    assert [m.id for m in client.models.list()] == ["demo"]


def test_a_browser_logs_in_and_watches_the_log_pane_update(demo):
    reason = browser.missing_reason()
    if reason:
        pytest.skip(reason)
    base = demo["url"].removesuffix("/v1")
    b = browser.Browser()
    try:
        b.get(base + "/")
        b.type("input[name=email]", "admin@localhost")
        b.type("input[name=password]", demo["password"])
        b.click("button[type=submit]")
        b.wait_for_text("local", css="#cluster")
        b.wait_for_text("demo-0: ready", css="#cluster")
        b.click("#node-local a")
        b.wait_for_text("sim: serving demo", css="#logpane")
        # A request made now must show up in the pane without reloading the page.
        posts = "POST /v1/chat/completions"
        before = b.text("#logpane").count(posts)
        demo["client"].chat.completions.create(model="demo", max_tokens=1,
                                               messages=[{"role": "user", "content": "again"}])
        deadline = time.monotonic() + 20
        while b.text("#logpane").count(posts) <= before:
            assert time.monotonic() < deadline, b.text("#logpane")
            time.sleep(0.25)
        b.screenshot(str(demo["root"] / "node-page.png"))
    finally:
        b.close()
