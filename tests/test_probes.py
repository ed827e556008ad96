"""Health probes get threads of their own: a reconciler whose default thread pool is busy with
long work (a release downloading, weights being hashed) still probes its engines at once."""
import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from llmgw.executors.probes import probe
from llmgw.services.engine_http import healthy


class _Health(BaseHTTPRequestHandler):
    def do_GET(self):
        ok = self.path == "/health" and self.headers.get("Authorization") == "Bearer sk-engine-k"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_probe_is_answered_while_every_default_pool_thread_is_busy():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    async def main():
        loop = asyncio.get_running_loop()
        release = threading.Event()
        # More blocked jobs than the default pool has threads: anything queued there waits
        # until they are released, which happens only after the probe has answered.
        blockers = [loop.run_in_executor(None, release.wait) for _ in range(64)]
        try:
            return await asyncio.wait_for(probe(healthy, url, "sk-engine-k"), timeout=30)
        finally:
            release.set()
            await asyncio.gather(*blockers)

    try:
        assert asyncio.run(main()) is True
    finally:
        server.shutdown()
        server.server_close()
