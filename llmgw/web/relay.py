"""Send an admitted request to a replica and relay the answer unbuffered, metering what it used."""
import json

import requests
from flask import Response, current_app, stream_with_context

from ..services.settlement import Settlement
from .openai_errors import error
from .usage_stream import UsageTap, ask_for_usage


def settlement():
    """Return this app's Settlement (one per worker process, or per test app)."""
    got = current_app.extensions.get("llmgw.settlement")
    if got is None:
        got = current_app.extensions["llmgw.settlement"] = Settlement()
    return got


def forward(endpoints, path, body, reservation, routes):
    """Send the request to the first endpoint that answers; relay its response as it comes."""
    g = current_app.config["LLMGW"]["gateway"]
    settle = settlement().add
    stream = bool(body.get("stream"))
    wants_usage = True
    if stream:
        body, wants_usage = ask_for_usage(body)
    data = json.dumps(body).encode()
    last = None
    for endpoint in endpoints[:3]:
        routes.inflight[endpoint] = routes.inflight.get(endpoint, 0) + 1
        try:
            headers = {"Content-Type": "application/json"}
            if endpoint in routes.auth:
                headers["Authorization"] = routes.auth[endpoint]
            upstream = routes.http.post(f"{endpoint}/{path}", data=data, stream=True, headers=headers,
                                     timeout=(g["connect_timeout"], g["read_timeout"]))
        except requests.RequestException as e:
            routes.inflight[endpoint] -= 1
            last = e
            continue  # nothing reached the client yet, so another replica may answer
        return _relay(upstream, endpoint, routes, reservation, UsageTap(wants_usage) if stream else None,
                      settle)
    settle(reservation, 0, 0, 502)
    return error(502, f"No replica answered ({last}).", "server_error", "upstream_unreachable")


def _relay(upstream, endpoint, routes, reservation, tap, settle):
    status = upstream.status_code

    def body():
        usage, outcome = None, 499  # until the end is reached, the client went away
        try:
            if tap is None:
                content = upstream.content
                usage = _usage_of(content)
                yield content
            else:
                # read1 returns what has arrived instead of waiting for a full buffer.
                while chunk := upstream.raw.read1(65536, decode_content=True):
                    out = tap.feed(chunk)
                    if out:
                        yield out
                rest = tap.flush()
                if rest:
                    yield rest
                usage = tap.usage
            outcome = status
        finally:
            upstream.close()  # on a disconnect this is what stops the engine generating
            routes.inflight[endpoint] -= 1
            settle(reservation, *_billed(usage, tap, outcome), outcome, endpoint)

    headers = {"Content-Type": upstream.headers.get("Content-Type", "application/json"),
               "X-Accel-Buffering": "no", "Cache-Control": "no-cache",
               "X-Llmgw-Model": reservation.model}  # which model served it (a fallback, maybe)
    return Response(stream_with_context(body()), status=status, headers=headers)


def _usage_of(content):
    try:
        usage = json.loads(content).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None


def _billed(usage, tap, status):
    """Return (prompt, completion) tokens to bill: what the engine says it used; without its
    word, what was seen to be generated."""
    if usage:
        return int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    if status >= 400 and status != 499:
        return 0, 0
    return 0, tap.content_events if tap else 0
