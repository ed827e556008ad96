"""A headless Chromium driven through chromedriver's W3C WebDriver protocol, with requests only.

Debian's chromium + chromium-driver; never a browser download. Enough of WebDriver for
tests that log in, follow links and wait for HTMX to change a page.
"""
import shutil
import subprocess
import tempfile
import time

import requests

from .ports import free_port

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage"]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


def missing_reason():
    """Say why a browser test cannot run here, or None."""
    for tool in ("chromium", "chromedriver"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y chromium chromium-driver)"
    return None


class Browser:
    def __init__(self):
        self.port = free_port()
        self.profile = tempfile.mkdtemp(prefix="llmgw-chromium-")
        self.driver = subprocess.Popen(["chromedriver", f"--port={self.port}"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"
        self._wait_driver()
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": shutil.which("chromium"),
                                   "args": CHROMIUM_FLAGS + [f"--user-data-dir={self.profile}"]}}}}
        self.session = self._call("post", "/session", caps)["sessionId"]

    def _wait_driver(self):
        for _ in range(100):
            try:
                requests.get(self.base + "/status", timeout=1)
                return
            except requests.RequestException:
                time.sleep(0.1)
        raise RuntimeError("chromedriver did not start")

    def _call(self, method, path, body=None):
        resp = getattr(requests, method)(self.base + path, json=body, timeout=60)
        value = resp.json().get("value")
        if resp.status_code != 200:
            raise RuntimeError(f"WebDriver {path}: {value}")
        return value

    def _s(self, path, method="post", body=None):
        if body is None and method == "post":
            body = {}
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url):
        self._s("/url", body={"url": url})

    def find(self, css):
        return self._s("/element", body={"using": "css selector", "value": css})[ELEMENT]

    def type(self, css, text):
        self._s(f"/element/{self.find(css)}/value", body={"text": text})

    def click(self, css):
        self._s(f"/element/{self.find(css)}/click")

    def text(self, css="body"):
        return self._s(f"/element/{self.find(css)}/text", method="get", body=None)

    def url(self):
        return self._s("/url", method="get", body=None)

    def execute(self, script, *args):
        """Run JavaScript in the page; return its value."""
        return self._s("/execute/sync", body={"script": script, "args": list(args)})

    def select(self, css, value):
        """Choose an option of a <select> by its value and fire its change event."""
        self.execute("const e = document.querySelector(arguments[0]); e.value = arguments[1];"
                     "e.dispatchEvent(new Event('change', {bubbles: true}));", css, value)

    def submit(self, css):
        """Click a form's submit button, saying yes to its confirm() question if it asks one."""
        self.execute("window.confirm = () => true;")
        self.click(css)

    def screenshot(self, path):
        import base64
        data = self._s("/screenshot", method="get", body=None)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def wait_for_text(self, needle, css="body", timeout=20):
        """Wait until an element's text contains needle; return that text."""
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            try:
                text = self.text(css)
            except RuntimeError:
                text = ""
            if needle in text:
                return text
            time.sleep(0.25)
        raise AssertionError(f"{needle!r} did not appear in {css} within {timeout} s; it shows:\n{text[-2000:]}")

    def close(self):
        try:
            self._call("delete", f"/session/{self.session}")
        except (requests.RequestException, RuntimeError):
            pass
        self.driver.terminate()
        self.driver.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)
