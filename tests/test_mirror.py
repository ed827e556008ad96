"""The mirror: fetched once from a real HTTP server on loopback that cuts the connection half-way,
continued with a Range request, verified, listed, used by a model, removed."""
import hashlib
import http.server
import json
import re
import threading

import pytest

from llmgw.models import Model
from tests.harness.tiny_gguf import write_tiny_gguf
from tests.test_model_catalog import cli  # noqa: F401  (fixture)


class Origin:
    """Serves one file; the first `cuts` answers stop half-way and drop the connection."""

    def __init__(self, data, cuts=1):
        self.data, self.cuts, self.asked = data, cuts, []
        origin = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_GET(self):
                rng = self.headers.get("Range", "")
                origin.asked.append((self.path, rng))
                if self.path != "/files/model.gguf":
                    self.send_error(404)
                    return
                start = int(re.match(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                body = origin.data[start:]
                self.send_response(206 if rng else 200)
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(origin.data) - 1}/{len(origin.data)}")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if origin.cuts > 0:
                    origin.cuts -= 1
                    self.wfile.write(body[:len(body) // 2])
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/files/model.gguf"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def origin(tmp_path):
    made = []

    def make(data, cuts=1):
        made.append(Origin(data, cuts))
        return made[-1]
    yield make
    for o in made:
        o.close()


def test_a_fetch_cut_half_way_continues_with_a_range_and_is_verified(app, cli, origin, tmp_path):
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    want = hashlib.sha256(data).hexdigest()
    src = origin(data)
    out = cli("mirror", "fetch", src.url, "--name", "tiny.gguf", "--sha256", want)
    assert out.exit_code == 0, out.output
    half = len(data) // 2
    assert f"the connection broke at {half} bytes" in out.output
    assert "mirrored tiny.gguf: " in out.output and f"sha256 {want} (verified against --sha256)" in out.output
    assert src.asked == [("/files/model.gguf", ""), ("/files/model.gguf", f"bytes={half}-")]
    listed = json.loads(cli("mirror", "list", "--json").output)
    assert [(e["name"], e["bytes"], e["sha256"], e["state"], e["in_use_by"]) for e in listed] == \
        [("tiny.gguf", len(data), want, "complete", [])]
    again = cli("mirror", "fetch", src.url, "--name", "tiny.gguf")
    assert "tiny.gguf is mirrored already" in again.output and len(src.asked) == 2  # nothing fetched
    # A model uses it; then it cannot be removed from under the model.
    added = cli("model", "add", "tiny", "--file", "mirror:tiny.gguf")
    assert added.exit_code == 0, added.output
    assert Model.get(Model.name == "tiny").sha256 == want
    refused = cli("mirror", "remove", "tiny.gguf")
    assert refused.exit_code != 0 and "tiny.gguf is used by model(s) tiny" in refused.output
    cli("model", "remove", "tiny")
    assert "removed tiny.gguf from the mirror" in cli("mirror", "remove", "tiny.gguf").output
    assert json.loads(cli("mirror", "list", "--json").output) == []


def test_a_file_that_does_not_match_is_deleted_and_nothing_is_mirrored(app, cli, origin):
    src = origin(b"not the model at all" * 100, cuts=0)
    out = cli("mirror", "fetch", src.url, "--sha256", "0" * 64)
    assert out.exit_code != 0
    assert f"{src.url} does not match --sha256 (got " in out.output and "nothing was mirrored" in out.output
    assert json.loads(cli("mirror", "list", "--json").output) == []


def test_bad_urls_names_and_sources_are_refused_by_name(app, cli, origin):
    src = origin(b"x", cuts=0)
    gone = src.url.replace("model.gguf", "missing.gguf")
    out = cli("mirror", "fetch", gone)
    assert out.exit_code != 0 and f"GET {gone} answered 404 Not Found; check the URL" in out.output
    assert "not an http(s) URL" in cli("mirror", "fetch", "ftp://x/y").output
    assert "mirror name '.hidden' must be letters" in cli("mirror", "fetch", src.url, "--name", ".hidden").output
    missing = cli("model", "add", "m", "--file", "mirror:nothing.gguf")
    assert missing.exit_code != 0
    assert "no mirrored file called 'nothing.gguf' (mirror: none yet)" in missing.output
    assert json.loads(cli("mirror", "list", "--json").output) == []


def test_the_mirror_page_lists_entries_and_removes_an_unused_one(app, cli, origin, client, auth, tmp_path):
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    cli("mirror", "fetch", origin(data, cuts=0).url)
    auth.login(password=auth.password)
    page = client.get("/mirror").get_data(as_text=True)
    assert 'id="mirror-model.gguf"' in page and "complete" in page and "no model" in page
    token = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)
    done = client.post("/mirror/model.gguf/remove", data={"csrf_token": token}, follow_redirects=True)
    assert "removed model.gguf from the mirror" in done.get_data(as_text=True)


def test_a_node_downloading_a_url_model_itself_continues_a_cut_download(app, origin, tmp_path):
    """weights.download_on_node: the node runs curl; a download cut half-way is kept and the
    next attempt asks for the rest only; the file is checked against the model's sha256."""
    import asyncio
    import shutil

    from llmgw.errors import InstallError
    from llmgw.executors.transport import LocalTransport
    from llmgw.services import weights
    if not shutil.which("curl"):
        pytest.skip("curl is not installed here")
    data = write_tiny_gguf(tmp_path / "tiny.gguf").read_bytes()
    src = origin(data)
    model = Model.create(name="url", source=src.url, sha256=hashlib.sha256(data).hexdigest())
    base = tmp_path / "node"
    seen = []

    def fetch():
        return asyncio.run(weights.ensure_on_node(LocalTransport(), str(base), model, str(tmp_path / "c"),
                                                  0, lambda *a: seen.append(a), 0, ["curl"]))
    with pytest.raises(InstallError, match="what arrived is kept and continued on the next attempt"):
        fetch()
    path = fetch()
    assert open(path, "rb").read() == data
    half = len(data) // 2
    assert src.asked == [("/files/model.gguf", ""), ("/files/model.gguf", f"bytes={half}-")]
    assert seen[-1] == (len(data), len(data), len(data) - half, half)
    assert not (tmp_path / "c").exists()  # the control plane never downloaded it
