"""Every page an operator or a user handles, driven in headless Chromium against a served demo:
forms submit with their CSRF token, HTMX parts update, a user who is not an administrator gets
their own home and a styled 403 on admin pages, the log pane follows an engine's new lines."""
import re
import subprocess
import sys

import pytest

from tests.conftest import TOP
from tests.e2e.conftest import wait_for
from tests.e2e.test_demo_browser import demo  # noqa: F401  (the served demo, a fixture)
from tests.harness import browser

pytestmark = pytest.mark.e2e


@pytest.fixture
def b():
    reason = browser.missing_reason()
    if reason:
        pytest.skip(reason)
    driver = browser.Browser()
    yield driver
    driver.close()


def cli(root, *args):
    out = subprocess.run([sys.executable, "-m", "flask", "--app", "llmgw:create_app", "llmgw", *args,
                          "--root", str(root)], cwd=TOP, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def login(b, base, email, password):
    b.get(base + "/login")
    b.type("input[name=email]", email)
    b.type("input[name=password]", password)
    b.click("button[type=submit]")


def test_an_administrator_manages_models_projects_endpoints_and_keys_in_the_browser(demo, b):  # noqa: F811
    base = demo["url"].removesuffix("/v1")
    login(b, base, "admin@localhost", demo["password"])
    b.wait_for_text("Replicas", css="#totals")
    b.wait_for_text("demo-0: ready", css="#cluster")

    # Models: add one with the form, scale it, see it listed; the CLI sees the same.
    b.get(base + "/models")
    b.type("#add-model input[name=name]", "browser-made")
    b.select("#add-model select[name=engine]", "sim")
    b.type("#add-model input[name=replicas]", "0")
    b.click("#add-model button[type=submit]")
    b.wait_for_text("Added model browser-made.")
    b.get(base + "/models")
    b.execute("document.querySelector('#model-browser-made input[name=replicas]').value = '2'")
    b.click("#model-browser-made form.scale button")
    b.wait_for_text("Changed replicas of browser-made.")
    assert '"replicas": 2' in cli(demo["root"], "model", "show", "browser-made", "--json")
    b.get(base + "/models/browser-made")
    b.click("#change-model summary")
    b.type("#set-model input[name=memory]", "1G")
    b.click("#set-model button[type=submit]")
    b.wait_for_text("Changed memory_mb of browser-made.")
    assert '"memory_mb": 1024' in cli(demo["root"], "model", "show", "browser-made", "--json")
    b.click("#change-model summary")
    b.submit("#remove-model button[type=submit]")
    b.wait_for_text("Removed model browser-made")

    # Projects: a limit set in the form is what `limits show` reads.
    b.get(base + "/projects")
    b.type("#limits-project-default input[name=tpm]", "123456")
    b.click("#limits-project-default button")
    b.wait_for_text("tpm 123456")
    assert '"tpm": 123456' in cli(demo["root"], "limits", "show", "--json")
    b.type("#limits-project-default input[name=rpm]", "-5")
    b.click("#limits-project-default button")
    b.wait_for_text("not a whole number of 0 or more")
    b.get(base + "/projects")
    b.type("#limits-project-default input[name=tpm]", "0")  # taken off again
    b.click("#limits-project-default button")
    b.wait_for_text("tpm none")

    # A project's page: an account added as a member; the quotas page edits limits too.
    cli(demo["root"], "users", "create", "cy@example.com")
    b.get(base + "/projects/default")
    b.type("#add-member input[name=email]", "cy@example.com")
    b.click("#add-member button")
    b.wait_for_text("cy@example.com", css="#members")
    b.get(base + "/quotas")
    b.type("#new-limit input[name=name]", "default")
    b.select("#new-limit select[name=kind]", "team")
    b.type("#new-limit input[name=rpm]", "777")
    b.click("#new-limit button")
    b.wait_for_text("rpm 777")
    assert b.url().endswith("/quotas")

    # Endpoints: added, shown with its health, removed.
    b.get(base + "/endpoints")
    b.type("#add-endpoint input[name=name]", "far")
    b.type("#add-endpoint input[name=url]", "http://127.0.0.1:9/v1")
    b.type("#add-endpoint input[name=models]", "far-model")
    b.click("#add-endpoint button[type=submit]")
    b.wait_for_text("Endpoint far added")
    b.wait_for_text("unreachable", css="#endpoint-far", timeout=30)  # checked, and the table polled
    b.submit("#endpoint-far button")
    b.wait_for_text("Endpoint far removed")

    # Keys: every key listed; the usage page draws its charts and offers the CSV.
    b.get(base + "/admin/keys")
    b.wait_for_text("demo", css="#keys")
    b.get(base + "/usage/default?step=day")
    assert b.execute("return document.querySelectorAll('#charts svg').length") == 5
    assert "usage-default" in b.execute("return document.querySelector('#csv').href") or \
        "usage/default.csv" in b.execute("return document.querySelector('#csv').href")


def test_a_user_gets_a_home_makes_a_key_and_cannot_reach_admin_pages(demo, b):  # noqa: F811
    base = demo["url"].removesuffix("/v1")
    made = cli(demo["root"], "users", "create", "bo@example.com", "--project", "default")
    password = re.search(r"password: (\S+)", made).group(1)
    login(b, base, "bo@example.com", password)
    b.wait_for_text("Your projects")
    assert b.url().endswith("/home")
    b.get(base + "/profile")
    b.type("#new-key-form input[name=name]", "laptop")
    b.click("#new-key-form button[type=submit]")
    key = re.search(r"sk-llmgw-\S+", b.wait_for_text("sk-llmgw-", css="#new-key")).group(0)
    answer = demo["client"].with_options(api_key=key).chat.completions.create(
        model="demo", max_tokens=1, messages=[{"role": "user", "content": "from bo"}])
    assert answer.choices
    b.get(base + "/home")
    b.wait_for_text("laptop", css="#keys")
    assert key not in b.text()
    b.submit("#keys button")
    b.wait_for_text("Revoked")
    for path in ("/", "/admin/keys", "/models", "/nodes/local", "/projects"):
        b.get(base + path)
        text = b.text()
        if path == "/":
            assert b.url().endswith("/home"), path
            continue
        assert "403" in text and "This page is for administrators." in text and "Your home" in text, (path, text)
    b.get(base + "/no/such/page")
    assert "404" in b.text() and "Your home" in b.text()


def test_the_log_pane_follows_new_lines_timestamped_with_probes_hidden(demo, b):  # noqa: F811
    base = demo["url"].removesuffix("/v1")
    login(b, base, "admin@localhost", demo["password"])
    b.wait_for_text("demo-0", css="#cluster")
    b.get(base + "/nodes/local?lines=100")
    b.wait_for_text("sim: serving demo", css="#logpane")
    # The control plane's own commands on the node have a pane of their own.
    b.wait_for_text("exit", css="#commands")
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", b.text("#commands"))
    posts = "POST /v1/chat/completions"
    before = b.text("#logpane").count(posts)
    demo["client"].chat.completions.create(model="demo", max_tokens=1,
                                           messages=[{"role": "user", "content": "follow me"}])
    wait_for("the new request's line in the pane", lambda: b.text("#logpane").count(posts) > before,
             timeout=20, every=0.25)
    # The newest line is at the bottom, timestamped, and the pane is scrolled to it.
    last = b.execute("const l = document.querySelectorAll('#logpane .logline'); return l[l.length - 1].textContent")
    assert re.match(r"\s*\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", last), last
    wait_for("the pane to follow to its bottom", lambda: b.execute(
        "const p = document.getElementById('logpane'); return p.scrollTop + p.clientHeight >= p.scrollHeight - 8"),
        timeout=10, every=0.2)
    # The engine answers llmgw's health probes every few seconds: with probes asked for, they
    # are there; in the default pane over the same stretch of log, none is.
    b.get(base + "/nodes/local?lines=2000&probes=1")
    b.wait_for_text("GET /health", css="#logpane", timeout=30)
    b.get(base + "/nodes/local?lines=2000")
    shown = b.wait_for_text("sim: serving demo", css="#logpane")
    assert "GET /health" not in shown and posts in shown
