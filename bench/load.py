"""A load generator for OpenAI-compatible chat completions (stdlib only).

Raw asyncio sockets, HTTP/1.1 keep-alive, one connection per concurrent client; optionally split
over several processes (--procs). Runs N requests at a fixed concurrency, bounded by --max-seconds,
and prints (or writes with --json) p50/p95/p99 latency, req/s, and for streams time to first chunk
and chunks/s.

    python3 bench/load.py --url http://127.0.0.1:9100/v1 --model fake -n 5000 -c 32 [--stream]
"""
import argparse
import asyncio
import json
import multiprocessing
import sys
import time
from urllib.parse import urlsplit


def pct(values, p):
    if not values:
        return None
    values = sorted(values)
    k = min(len(values) - 1, max(0, int(round(p / 100 * len(values) + 0.5)) - 1))
    return values[k]


async def read_response(reader, t0, stream):
    """Read one HTTP/1.1 response; return (status, body, first_chunk_time, keep_alive)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ", 2)[1])
    length, is_chunked, keep = None, False, True
    for line in lines[1:]:
        name, _, value = line.partition(":")
        name = name.strip().lower()
        value = value.strip().lower()
        if name == "content-length":
            length = int(value)
        elif name == "transfer-encoding" and "chunked" in value:
            is_chunked = True
        elif name == "connection" and value == "close":
            keep = False
    first = None
    if is_chunked:
        # Parse the chunk framing from whole reads instead of two awaits per chunk: the
        # generator must cost less than what it measures.  No pipelining, so nothing follows.
        buf = bytearray()
        parts = []
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol >= 0:
                size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
                if size == 0:
                    if len(buf) < eol + 4:
                        buf += await reader.readexactly(eol + 4 - len(buf))
                    break
                end = eol + 2 + size
                if len(buf) >= end + 2:
                    data = bytes(buf[eol + 2:end])
                    if first is None and stream and b"data: {" in data:
                        first = time.perf_counter() - t0
                    parts.append(data)
                    pos = end + 2
                    continue
            more = await reader.read(262144)
            if not more:
                raise asyncio.IncompleteReadError(bytes(buf), None)
            if pos > 65536:
                del buf[:pos]
                pos = 0
            buf += more
        body = b"".join(parts)
    elif length is not None:
        body = await reader.readexactly(length)
    else:
        body = await reader.read()
        keep = False
    if stream and first is None and b"data: {" in body:
        first = time.perf_counter() - t0  # unchunked stream: only known at the end
    return status, body, first, keep


async def client(args, queue, res, deadline):
    u = urlsplit(args.url)
    host, port = u.hostname, u.port or 80
    path = u.path.rstrip("/") + "/chat/completions"
    payload = {"model": args.model, "messages": [{"role": "user", "content": "say something"}],
               "max_tokens": args.max_tokens}
    if args.stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    body = json.dumps(payload).encode()
    auth = f"Authorization: Bearer {args.key}\r\n".encode() if args.key else b""
    req = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
           f"Content-Length: {len(body)}\r\n").encode() + auth + b"\r\n" + body
    reader = writer = None
    while time.monotonic() < deadline:
        try:
            queue.pop()
        except IndexError:
            break
        t0 = time.perf_counter()
        try:
            if writer is None:
                reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
            writer.write(req)
            status, data, first, keep = await asyncio.wait_for(
                read_response(reader, t0, args.stream), args.timeout)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError,
                asyncio.LimitOverrunError) as e:
            res["errors"] += 1
            res["error_kinds"][type(e).__name__] = res["error_kinds"].get(type(e).__name__, 0) + 1
            if writer is not None:
                writer.close()
            reader = writer = None
            continue
        dt = time.perf_counter() - t0
        ok = status == 200
        if ok and args.stream:
            chunks = data.count(b"data: {")
            ok = data.rstrip().endswith(b"data: [DONE]") and chunks >= args.max_tokens
            res["chunks"] += chunks
            if first is not None:
                res["ttfc"].append(first)
        if ok:
            res["lat"].append(dt)
        else:
            res["errors"] += 1
            kind = f"status {status}" if status != 200 else "incomplete stream"
            res["error_kinds"][kind] = res["error_kinds"].get(kind, 0) + 1
            if len(res["samples"]) < 3:
                res["samples"].append(data[:300].decode("utf-8", "replace"))
        if not keep:
            writer.close()
            reader = writer = None
    if writer is not None:
        writer.close()


async def run_async(args, n, concurrency):
    res = {"lat": [], "ttfc": [], "chunks": 0, "errors": 0, "error_kinds": {}, "samples": []}
    queue = list(range(n))
    deadline = time.monotonic() + args.max_seconds
    start = time.time()
    await asyncio.gather(*(client(args, queue, res, deadline) for _ in range(concurrency)))
    res["start"], res["end"] = start, time.time()
    res["unsent"] = len(queue)
    return res


def run_proc(args, n, concurrency, out):
    out.put(asyncio.run(run_async(args, n, concurrency)))


def run(args):
    if args.procs <= 1:
        parts = [asyncio.run(run_async(args, args.n, args.concurrency))]
    else:
        out = multiprocessing.Queue()
        procs = []
        for i in range(args.procs):
            n = args.n // args.procs + (1 if i < args.n % args.procs else 0)
            c = args.concurrency // args.procs + (1 if i < args.concurrency % args.procs else 0)
            p = multiprocessing.Process(target=run_proc, args=(args, n, c, out))
            p.start()
            procs.append(p)
        parts = [out.get(timeout=args.max_seconds + args.timeout + 60) for _ in procs]
        for p in procs:
            p.join(timeout=10)
    lat = [x for p in parts for x in p["lat"]]
    ttfc = [x for p in parts for x in p["ttfc"]]
    wall = max(p["end"] for p in parts) - min(p["start"] for p in parts)
    chunks = sum(p["chunks"] for p in parts)
    kinds = {}
    for p in parts:
        for k, v in p["error_kinds"].items():
            kinds[k] = kinds.get(k, 0) + v
    ms = lambda v: None if v is None else round(v * 1000, 3)
    return {
        "url": args.url, "model": args.model, "stream": args.stream, "requests": args.n,
        "concurrency": args.concurrency, "procs": args.procs, "ok": len(lat),
        "errors": sum(p["errors"] for p in parts), "error_kinds": kinds,
        "unsent": sum(p["unsent"] for p in parts),
        "error_samples": [s for p in parts for s in p["samples"]][:3],
        "wall_s": round(wall, 3), "req_s": round(len(lat) / wall, 1) if wall else None,
        "p50_ms": ms(pct(lat, 50)), "p95_ms": ms(pct(lat, 95)), "p99_ms": ms(pct(lat, 99)),
        "ttfc_p50_ms": ms(pct(ttfc, 50)), "ttfc_p95_ms": ms(pct(ttfc, 95)),
        "ttfc_p99_ms": ms(pct(ttfc, 99)),
        "chunks_s": round(chunks / wall, 1) if args.stream and wall else None,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="OpenAI base URL, e.g. http://127.0.0.1:8080/v1")
    ap.add_argument("--key", default="", help="bearer token")
    ap.add_argument("--model", default="fake")
    ap.add_argument("-n", type=int, default=1000, help="requests in all")
    ap.add_argument("-c", "--concurrency", type=int, default=32)
    ap.add_argument("--procs", type=int, default=1, help="generator processes (concurrency is split)")
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 100 streamed, 16 not")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per request")
    ap.add_argument("--max-seconds", type=float, default=300, help="stop sending after this long")
    ap.add_argument("--json", help="also write the result here")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    if args.max_tokens is None:
        args.max_tokens = 100 if args.stream else 16
    result = run(args)
    result["label"] = args.label
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(json.dumps(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
