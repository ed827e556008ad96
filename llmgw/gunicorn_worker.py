"""The gunicorn worker llmgw serves with: gevent's, with the requests gunicorn's own parser
refuses (an oversized header, a bad request line, a malformed Content-Length) answered in
OpenAI's error shape instead of an HTML page, so API clients can read why.

gunicorn parses and judges the request; only the rendering of its refusal is ours. gunicorn
writes that page through `gunicorn.util.write_error` (called as `util.write_error` by the
worker's `handle_error`), which this worker replaces in its own process when it starts.
"""
import json
import signal

from gunicorn import util
from gunicorn.workers.ggevent import GeventWorker


def write_json_error(sock, status_int, reason, mesg):
    """Send gunicorn's refusal as `{"error": {...}}` and close, as gunicorn's page does."""
    message = f"{reason}: {mesg}" if mesg else reason
    if len(message) > 300:  # the message may quote the request line or a header
        message = message[:300] + "…"
    body = json.dumps({"error": {
        "message": message, "type": "invalid_request_error" if status_int < 500 else "server_error",
        "param": None, "code": f"http_{status_int}"}}).encode()
    head = (f"HTTP/1.1 {status_int} {reason}\r\nConnection: close\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    util.write_nonblock(sock, head.encode("latin-1") + body)


class Worker(GeventWorker):
    def init_process(self):
        util.write_error = write_json_error
        super().init_process()

    def init_signals(self):
        """SIGINT (Ctrl-C in the terminal, which reaches every process of the group) stops the
        worker as SIGTERM does: its requests get gateway.shutdown_grace and its exit settles
        them. gunicorn's own SIGINT is a quick exit, which cut that exit short with a traceback."""
        super().init_signals()
        signal.signal(signal.SIGINT, self.handle_exit)
