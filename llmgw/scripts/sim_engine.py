#!/usr/bin/env python3
"""A simulated inference engine speaking the OpenAI API, stdlib only, for the demo and tests.

It runs on any node with python3 and answers like llama-server: /health, /v1/models,
/v1/chat/completions and /v1/completions (streamed or not, with usage), /v1/embeddings.
Its replies are made-up words, produced at a steady pace, and say so.
"""
import argparse
import hashlib
import hmac
import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

VERSION = "llmgw-sim 1"
WORDS = ("this", "is", "a", "simulated", "reply", "from", "the", "llmgw", "demo", "engine",
         "no", "model", "weights", "were", "loaded", "tokens", "arrive", "one", "by", "another")


def words_for(prompt, n):
    seed = int(hashlib.sha256(prompt.encode()).hexdigest(), 16)
    return [WORDS[(seed >> (i % 200)) % len(WORDS)] if i > 5 else WORDS[i] for i in range(n)]


def prompt_of(body):
    if "messages" in body:
        return " ".join(str(m.get("content", "")) for m in body.get("messages", []))
    return str(body.get("prompt", ""))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmgw-sim"

    def log_message(self, fmt, *args):
        sys.stderr.write("sim: %s %s\n" % (self.address_string(), fmt % args))
        sys.stderr.flush()

    def _json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _refused(self):
        """Answer 401 and return True when keys are set and the request carries none of them.

        Like llama-server, /health answers anyone: it says nothing but "up"."""
        if not self.server.keys or self.path == "/health":
            return False
        given = self.headers.get("Authorization", "")
        if any(hmac.compare_digest(given.encode(), ("Bearer " + k).encode()) for k in self.server.keys):
            return False
        self._json(401, {"error": {"message": "Invalid API Key", "type": "authentication_error",
                                   "code": 401}})
        return True

    def do_GET(self):
        if self.path == "/health":
            return self._json(200, {"status": "ok"})
        if self._refused():
            return None
        if self.path == "/metrics":
            # llama-server's names for the requests being worked on and those waiting, so the
            # reconciler can tell when a replica it is stopping has finished its work.
            data = ("llamacpp:requests_processing %d\nllamacpp:requests_deferred 0\n"
                    % self.server.busy).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            return self.wfile.write(data)
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [
                {"id": self.server.model, "object": "model", "owned_by": "llmgw-sim"}]})
        return self._json(404, {"error": {"message": "not found", "type": "not_found_error"}})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
        if self._refused():
            return None
        if self.path == "/v1/embeddings":
            return self._embeddings(body)
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            return self._json(404, {"error": {"message": "not found", "type": "not_found_error"}})
        with self.server.lock:
            self.server.busy += 1
        try:
            return self._generate(body)
        finally:
            with self.server.lock:
                self.server.busy -= 1

    def _generate(self, body):
        chat = self.path.endswith("chat/completions")
        time.sleep(self.server.first_byte_delay)
        prompt = prompt_of(body)
        # Like a real engine: max_completion_tokens, else max_tokens, else its own default
        # (a real one generates to the end of its context); n choices of that many each.
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        length = max(1, min(int(asked or self.server.default_tokens), 100000))
        choices = max(1, min(int(body.get("n") or 1), 128))
        words = words_for(prompt, length)
        used = self.server.count(prompt)
        usage = {"prompt_tokens": used, "completion_tokens": length * choices,
                 "total_tokens": used + length * choices}
        ident = "sim-%d" % int(time.time() * 1000)
        if body.get("stream"):
            return self._stream(ident, chat, words, usage, body, choices)
        # With --whole-delay a whole answer takes its time too; like llama-server and vLLM,
        # generation then stops when the client closes its connection.
        for _ in words if self.server.whole_delay else ():
            time.sleep(self.server.whole_delay)
            if self._client_gone():
                self.log_message("client went away before the answer; generation stopped")
                self.close_connection = True
                return None
        text = " ".join(words)
        made = [({"index": i, "message": {"role": "assistant", "content": text},
                  "finish_reason": "length"} if chat else
                 {"index": i, "text": text, "finish_reason": "length"}) for i in range(choices)]
        self._json(200, {"id": ident, "object": "chat.completion" if chat else "text_completion",
                         "created": int(time.time()), "model": self.server.model,
                         "choices": made, "usage": usage})

    def _client_gone(self):
        """Whether the client closed its connection (readable with nothing to read)."""
        try:
            ready, _, _ = select.select([self.connection], [], [], 0)
            return bool(ready) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _stream(self, ident, chat, words, usage, body, choices=1):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        kind = "chat.completion.chunk" if chat else "text_completion"
        time.sleep(self.server.prefill_delay)

        def send(obj):
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

        def chunk(delta, finish=None, index=0):
            c = ({"index": index, "delta": delta, "finish_reason": finish} if chat else
                 {"index": index, "text": delta.get("content", ""), "finish_reason": finish})
            return {"id": ident, "object": kind, "created": int(time.time()),
                    "model": self.server.model, "choices": [c]}
        try:
            if chat:
                for c in range(choices):
                    send(chunk({"role": "assistant", "content": ""}, index=c))
            for i, word in enumerate(words):
                time.sleep(self.server.delay)
                for c in range(choices):  # one event per choice and token, as engines send them
                    send(chunk({"content": word if i == 0 else " " + word}, index=c))
            for c in range(choices):
                send(chunk({}, "length", index=c))
            if (body.get("stream_options") or {}).get("include_usage"):
                send({"id": ident, "object": kind, "created": int(time.time()),
                      "model": self.server.model, "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.log_message("client went away after part of a stream")
        self.close_connection = True

    def _embeddings(self, body):
        inputs = body.get("input", "")
        inputs = inputs if isinstance(inputs, list) else [inputs]
        data = []
        for i, text in enumerate(inputs):
            digest = hashlib.sha256(str(text).encode()).digest()
            data.append({"object": "embedding", "index": i,
                         "embedding": [(b - 128) / 128 for b in digest]})
        used = sum(self.server.count(t) if isinstance(t, str) else
                   (len(t) if isinstance(t, list) else 1) for t in inputs)
        self._json(200, {"object": "list", "data": data, "model": self.server.model,
                         "usage": {"prompt_tokens": used, "total_tokens": used}})


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="sim")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8081)
    p.add_argument("--token-delay", type=float, default=0.02, help="seconds between streamed tokens")
    p.add_argument("--whole-delay", type=float, default=0.0,
                   help="seconds per token of an answer that is not streamed (0: it comes at once)")
    p.add_argument("--first-byte-delay", type=float, default=0.0,
                   help="seconds before answering at all (a long prompt being read)")
    p.add_argument("--prefill-delay", type=float, default=0.0,
                   help="seconds between a stream's headers and its first event")
    p.add_argument("--default-tokens", type=int, default=16,
                   help="tokens generated when a request gives no max_tokens (a real engine goes on "
                        "to the end of its context)")
    p.add_argument("--count", choices=("words", "chars"), default="words",
                   help="how prompt tokens are counted: one a word, or one a character (what a "
                        "tokenizer does with CJK or emoji)")
    p.add_argument("--api-key-file", default="",
                   help="a file of API keys, one a line ('#' starts a comment): every request but "
                        "/health must carry one as 'Authorization: Bearer KEY'")
    p.add_argument("--version", action="store_true")
    args = p.parse_args(argv)
    if args.version:
        print("version: " + VERSION)
        return 0
    ThreadingHTTPServer.request_queue_size = 256  # the default backlog of 5 refuses bursts
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    server.daemon_threads = True
    server.model, server.delay, server.first_byte_delay = args.model, args.token_delay, args.first_byte_delay
    server.prefill_delay, server.whole_delay = args.prefill_delay, args.whole_delay
    server.default_tokens = args.default_tokens
    server.count = (lambda text: len(text) + 1) if args.count == "chars" else \
        (lambda text: len(text.split()) + 1)
    server.busy, server.lock = 0, threading.Lock()
    server.keys = []
    if args.api_key_file:
        with open(args.api_key_file) as f:
            server.keys = [line.strip() for line in f if line.strip() and not line.startswith("#")]
    print("sim: serving %s on %s:%d" % (args.model, args.host, args.port), flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
