"""Read usage out of an OpenAI event stream while relaying it, event by event.

The engine is always asked for stream_options.include_usage; its usage event is passed on
only when the client asked for it too. Events are relayed as soon as they are complete, so
nothing waits for the end of the stream.
"""
import json


class UsageTap:
    def __init__(self, client_wants_usage):
        self.client_wants_usage = client_wants_usage
        self.buffer = b""
        self.usage = None
        self.content_events = 0
        self.done = False  # saw `data: [DONE]`, which every OpenAI-compatible stream ends with

    def feed(self, data):
        """Take bytes from upstream; return the bytes to send on now."""
        self.buffer += data
        out = []
        while True:
            end = self._event_end()
            if end < 0:
                break
            event, self.buffer = self.buffer[:end], self.buffer[end:]
            if self._keep(event):
                out.append(event)
        return b"".join(out)

    def flush(self):
        rest, self.buffer = self.buffer, b""
        return rest

    def _event_end(self):
        for sep in (b"\n\n", b"\r\n\r\n"):
            i = self.buffer.find(sep)
            if i >= 0:
                return i + len(sep)
        return -1

    def _keep(self, event):
        payload = event.strip()
        if not payload.startswith(b"data:"):
            return True
        body = payload[5:].strip()
        if body == b"[DONE]":
            self.done = True
            return True
        try:
            obj = json.loads(body)
        except ValueError:
            return True
        if isinstance(obj, dict) and obj.get("usage"):
            self.usage = obj["usage"]
            if not obj.get("choices") and not self.client_wants_usage:
                return False  # the usage-only event the client did not ask for
        if isinstance(obj, dict) and any(_has_text(c) for c in obj.get("choices") or []):
            self.content_events += 1
        return True


def _has_text(choice):
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or choice.get("text"))


def ask_for_usage(body):
    """Return (body for the engine, whether the client asked for usage itself)."""
    options = body.get("stream_options") if isinstance(body.get("stream_options"), dict) else {}
    wanted = bool(options.get("include_usage"))
    upstream = dict(body, stream_options=dict(options, include_usage=True))
    return upstream, wanted
