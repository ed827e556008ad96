"""Read usage out of an OpenAI event stream while relaying it, event by event.

The engine is always asked for stream_options.include_usage; its usage event is passed on
only when the client asked for it too. Events are relayed as soon as they are complete, so
nothing waits for the end of the stream.
"""
import json
import re


# Only an event that carries a usage object is parsed; the rest are looked at as bytes (a JSON
# string cannot hold an unescaped quote, so these patterns cannot match inside generated text).
USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
TEXT = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')
DONE = re.compile(rb"^data:\s*\[DONE\]\s*$")


class UsageTap:
    def __init__(self, client_wants_usage):
        self.client_wants_usage = client_wants_usage
        self.buffer = b""
        self.sep = None  # b"\n\n" or b"\r\n\r\n", whichever the engine ends events with
        self.usage = None
        self.content_events = 0
        self.done = False  # saw `data: [DONE]`, which every OpenAI-compatible stream ends with

    def feed(self, data):
        """Take bytes from upstream; return the bytes to send on now (whole events only)."""
        buf = self.buffer + data if self.buffer else data
        sep = self.sep or self._separator(buf)
        if sep is None:
            self.buffer = buf
            return b""
        kept, start, dropped = [], 0, False
        while (i := buf.find(sep, start)) >= 0:
            end = i + len(sep)
            event = buf[start:end]
            if self._keep(event):
                kept.append(event)
            else:
                dropped = True
            start = end
        self.buffer = buf[start:]
        return b"".join(kept) if dropped else buf[:start]

    def flush(self):
        rest, self.buffer = self.buffer, b""
        return rest

    def _separator(self, buf):
        found = [(i, s) for s in (b"\n\n", b"\r\n\r\n") if (i := buf.find(s)) >= 0]
        if found:
            self.sep = min(found)[1]
        return self.sep

    def _keep(self, event):
        if USAGE_OBJECT.search(event):
            return self._usage_event(event)
        if TEXT.search(event):
            self.content_events += 1
        elif DONE.match(event.strip()):
            self.done = True
        return True

    def _usage_event(self, event):
        payload = event.strip()
        try:
            obj = json.loads(payload[5:]) if payload.startswith(b"data:") else None
        except ValueError:
            obj = None
        if not isinstance(obj, dict):
            return True
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        if any(_has_text(c) for c in obj.get("choices") or [] if isinstance(c, dict)):
            self.content_events += 1
        elif not obj.get("choices") and not self.client_wants_usage:
            return False  # the usage-only event the client did not ask for
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
