"""A fast OpenAI-compatible fake upstream for benchmarks (stdlib only).

A raw asyncio HTTP/1.1 server with keep-alive:

  GET  /v1/models, /models, /health
  POST /v1/chat/completions   non-streamed: after --latency-ms, one chat.completion
                              streamed (stream: true): max_tokens chunks (default 100), as fast as
                              possible or --chunk-delay-ms apart, a usage chunk when
                              stream_options.include_usage, then `data: [DONE]`.

    python3 bench/fake_upstream.py --port 9100 [--latency-ms 50] [--chunk-delay-ms 0]
"""
import argparse
import asyncio
import json
import os
import signal
import time

MODELS = json.dumps({"object": "list", "data": [
    {"id": "fake", "object": "model", "created": 0, "owned_by": "bench"}]}).encode()


def response(status, body, content_type=b"application/json", close=False):
    reason = {200: b"OK", 400: b"Bad Request", 404: b"Not Found"}.get(status, b"Error")
    return (b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n%s\r\n"
            % (status, reason, content_type, len(body),
               b"Connection: close\r\n" if close else b"")) + body


def chunked(data):
    return b"%x\r\n%s\r\n" % (len(data), data)


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
               b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")


class Upstream(asyncio.Protocol):
    latency = 0.0
    chunk_delay = 0.0

    def connection_made(self, transport):
        self.transport = transport
        self.buf = b""
        self.busy = False  # a response is being produced; later pipelined requests wait
        self.closed = False

    def connection_lost(self, exc):
        self.closed = True

    def data_received(self, data):
        self.buf += data
        if not self.busy:
            self.process()

    def process(self):
        while not self.busy and not self.closed:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            lines = head.split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self.transport.write(response(400, b"{}", close=True))
                self.transport.close()
                return
            length = 0
            close = version == "HTTP/1.0"
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "connection":
                    close = value.strip().lower() == "close"
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4:end + 4 + length]
            self.buf = self.buf[end + 4 + length:]
            self.handle(method, target.split("?", 1)[0], body, close)

    def finish(self, close):
        if close:
            self.transport.close()
            return
        self.busy = False
        if self.buf:
            self.process()

    def handle(self, method, path, body, close):
        if method == "GET" and path in ("/v1/models", "/models"):
            self.transport.write(response(200, MODELS, close=close))
            return self.finish(close)
        if method == "GET" and path == "/health":
            self.transport.write(response(200, b'{"status":"ok"}', close=close))
            return self.finish(close)
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            try:
                req = json.loads(body)
            except ValueError:
                self.transport.write(response(400, b'{"error":{"message":"bad json"}}', close=close))
                return self.finish(close)
            self.busy = True
            if req.get("stream"):
                asyncio.ensure_future(self.stream(req, close))
            elif self.latency:
                asyncio.get_running_loop().call_later(self.latency, self.complete, req, close)
            else:
                self.complete(req, close)
            return None
        self.transport.write(response(404, b'{"error":{"message":"not found"}}', close=close))
        return self.finish(close)

    def complete(self, req, close):
        if self.closed:
            return
        n = int(req.get("max_tokens") or 16)
        prompt = sum(len(str(m.get("content", "")).split()) for m in req.get("messages") or [])
        body = json.dumps({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
            "model": req.get("model", "fake"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "tok " * n},
                         "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": n, "total_tokens": prompt + n},
        }, separators=(",", ":")).encode()
        self.transport.write(response(200, body, close=close))
        self.finish(close)

    async def stream(self, req, close):
        n = int(req.get("max_tokens") or 100)
        model = json.dumps(req.get("model", "fake"))
        usage = bool((req.get("stream_options") or {}).get("include_usage"))
        prompt = sum(len(str(m.get("content", "")).split()) for m in req.get("messages") or [])
        head = '{"id":"chatcmpl-fake","object":"chat.completion.chunk","created":%d,"model":%s,' % (
            int(time.time()), model)
        first = chunked(("data: " + head + '"choices":[{"index":0,"delta":{"role":"assistant",'
                         '"content":"tok "},"logprobs":null,"finish_reason":null}]}\n\n').encode())
        middle = chunked(("data: " + head + '"choices":[{"index":0,"delta":{"content":"tok "},'
                          '"logprobs":null,"finish_reason":null}]}\n\n').encode())
        last = ("data: " + head + '"choices":[{"index":0,"delta":{},"logprobs":null,'
                '"finish_reason":"length"}]}\n\n')
        if usage:
            last += ("data: " + head + '"choices":[],"usage":{"prompt_tokens":%d,'
                     '"completion_tokens":%d,"total_tokens":%d}}\n\n' % (prompt, n, prompt + n))
        last += "data: [DONE]\n\n"
        write = self.transport.write
        write(STREAM_HEAD)
        delay = self.chunk_delay
        for i in range(n):
            if self.closed:
                return
            if delay and i:
                await asyncio.sleep(delay)
            write(first if i == 0 else middle)
            if not delay and i % 16 == 15:
                await asyncio.sleep(0)  # let other connections in
        if self.closed:
            return
        write(chunked(last.encode()) + b"0\r\n\r\n")
        self.finish(close)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9100)
    ap.add_argument("--latency-ms", type=float, default=0.0, help="added to each non-streamed answer")
    ap.add_argument("--chunk-delay-ms", type=float, default=0.0, help="between stream chunks")
    args = ap.parse_args()
    Upstream.latency = args.latency_ms / 1000
    Upstream.chunk_delay = args.chunk_delay_ms / 1000

    async def serve():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Upstream, args.host, args.port, backlog=4096,
                                          reuse_address=True)
        stop = loop.create_future()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, lambda: stop.done() or stop.set_result(None))
        print(f"fake upstream on http://{args.host}:{args.port}/v1 (pid {os.getpid()}, "
              f"latency {args.latency_ms} ms, chunk delay {args.chunk_delay_ms} ms)", flush=True)
        await stop
        server.close()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
