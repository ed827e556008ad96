"""Send an admitted request to a replica and relay the answer unbuffered, metering what it used."""
import contextlib
import json
import os
import socket
import time

from flask import Response, current_app, request, stream_with_context

from ..services.leases import Ledger
from ..services.settlement import Settlement
from .openai_errors import error
from .upstream_http import Broken, ConnectFailed, HeadTimeout, ReadTimedOut
from .usage_stream import UsageTap, ask_for_usage


def settlement():
    """Return this app's Settlement (one per worker process, or per test app)."""
    got = current_app.extensions.get("llmgw.settlement")
    if got is None:
        dead_after = current_app.config["LLMGW"]["gateway"]["worker_dead_after"]
        got = current_app.extensions["llmgw.settlement"] = Settlement(ledger=Ledger(dead_after))
    return got


def start_resident(app):
    """In a gunicorn worker: its Settlement's thread runs from now until the worker exits."""
    with app.app_context():
        got = settlement()
        got.resident = True
        got.start()


class UpstreamFailed(Exception):
    """The replica stopped answering properly after its headers: a timeout (504) or a broken
    connection (502)."""

    def __init__(self, message, status, code):
        super().__init__(message)
        self.status, self.code = status, code


class ShuttingDown(UpstreamFailed):
    """The worker is stopping and its grace for requests in flight is over."""

    def __init__(self, grace):
        super().__init__(f"the gateway is shutting down and its {grace:g} s for requests in flight "
                         f"(gateway.shutdown_grace) are over; send the request again", 503,
                         "gateway_shutdown")


class ClientGone(Exception):
    """The client closed its connection while its whole answer was awaited."""


# Request greenlets relaying an answer, interrupted with ShuttingDown when the grace is over.
RELAYING = set()
SHUTDOWN_TIMERS = []
WATCH_AFTER = 0.5  # seconds an answer may take before the client's connection is watched


def _hub():
    """Return gevent's hub when this process runs under gevent (gunicorn's workers), else None."""
    try:
        from gevent import monkey
    except ImportError:
        return None
    if not monkey.is_module_patched("socket"):
        return None
    import gevent
    return gevent.get_hub()


def begin_shutdown(grace):
    """The worker stops taking requests: interrupt whatever is still relaying in `grace`
    seconds, each with an OpenAI error (an error event for streams) and billed."""
    hub = _hub()
    if hub is None:
        return

    def interrupt():
        for glet in list(RELAYING):
            hub.loop.run_callback(_throw, glet, ShuttingDown(grace))
    timer = hub.loop.timer(max(0.0, grace))
    timer.start(interrupt)
    SHUTDOWN_TIMERS.append(timer)  # kept referenced until it fires


def watch_shutdown(worker, grace):
    """In a gunicorn worker: when it stops taking requests (SIGTERM, a restart, max_requests),
    give what is in flight `grace` seconds, then interrupt it (begin_shutdown)."""
    import gevent

    def watch():
        while worker.alive:
            gevent.sleep(0.25)
        begin_shutdown(grace)
    gevent.spawn(watch)


def _throw(glet, error):
    if glet in RELAYING and not glet.dead:
        glet.throw(error)


@contextlib.contextmanager
def _relaying():
    """Mark the current greenlet as relaying for the block (so a shutdown can interrupt it)."""
    hub = _hub()
    if hub is None:
        yield
        return
    import gevent
    me = gevent.getcurrent()
    RELAYING.add(me)
    try:
        yield
    finally:
        RELAYING.discard(me)


@contextlib.contextmanager
def client_watch():
    """While a whole answer is awaited, notice the client closing its connection and raise
    ClientGone in the wait: the engine's connection is then closed, which stops its generation.

    Under gevent only. A hub timer starts watching the client's socket after WATCH_AFTER, so
    quick answers cost a timer and nothing else."""
    sock = request.environ.get("gunicorn.socket")
    hub = _hub()
    if sock is None or hub is None:
        yield
        return
    import gevent
    me = gevent.getcurrent()
    state = {"active": True, "io": None}

    def readable():
        try:
            with socket.socket(fileno=os.dup(sock.fileno())) as peek:
                peek.setblocking(False)
                data = peek.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return  # woken for nothing
        except OSError:
            data = b""
        state["io"].stop()
        if not data and state["active"]:  # closed; data would be a pipelined request instead
            hub.loop.run_callback(lambda: state["active"] and me.throw(ClientGone()))

    def watch():
        if state["active"]:
            state["io"] = hub.loop.io(sock.fileno(), 1)
            state["io"].start(readable)
    timer = hub.loop.timer(WATCH_AFTER)
    timer.start(watch)
    try:
        yield
    finally:
        state["active"] = False
        timer.close()
        if state["io"] is not None:
            state["io"].close()


def forward(endpoints, path, body, reservation, routes):
    """Send the request to the first endpoint that answers; relay its response as it comes."""
    g = current_app.config["LLMGW"]["gateway"]
    settling = settlement()
    settle = settling.add
    stream = bool(body.get("stream"))
    tap = None
    if stream:
        body, wants_usage = ask_for_usage(body)
        tap = UsageTap(wants_usage)
    # Until it ends, the worker's heartbeat carries what it relayed: billed if the worker dies.
    settling.ledger.inflight[reservation.request_id] = (
        reservation, (lambda: tap.content_events) if tap else (lambda: 0))
    data = json.dumps(body).encode()
    deadline = time.monotonic() + g["generation_timeout"]
    # A stream's headers come before the first token; a whole answer's come after the last.
    wait_first = g["first_byte_timeout"] if stream else g["generation_timeout"]
    try:
        with _relaying(), (contextlib.nullcontext() if stream else client_watch()):
            return _send(endpoints, path, data, reservation, routes, g, stream, tap, settle,
                         deadline, wait_first)
    except ClientGone:
        # Settled and counted down where it was raised; nobody reads this answer.
        return error(499, "The client closed its connection.", "invalid_request_error",
                     "client_closed", headers=_ids(reservation))
    except BaseException:
        if not reservation.settled:  # whatever failed, what it holds is given back
            settle(reservation, 0, 0, 500)
        raise


def _send(endpoints, path, data, reservation, routes, g, stream, tap, settle, deadline, wait_first):
    last = None
    for endpoint in endpoints[:3]:
        routes.inflight[endpoint] = routes.inflight.get(endpoint, 0) + 1
        try:
            headers = {"Content-Type": "application/json"}
            if endpoint in routes.auth:
                headers["Authorization"] = routes.auth[endpoint]
            upstream = routes.http.post(f"{endpoint}/{path}", data, headers, g["connect_timeout"],
                                        wait_first, g["engine_liveness"])
        except BaseException as e:
            # Whatever ended it, this endpoint has one request less; forward() settles what
            # is not settled here.
            routes.inflight[endpoint] -= 1
            if isinstance(e, HeadTimeout):
                # It took the request and may be working on it: another replica would do it twice.
                settle(reservation, 0, 0, 504, endpoint)
                which = "gateway.first_byte_timeout" if stream else "gateway.generation_timeout"
                return error(504, f"The replica did not start answering within {wait_first:g} s ({which}).",
                             "server_error", "upstream_timeout", headers=_ids(reservation))
            if isinstance(e, ConnectFailed):
                last = e
                continue  # nothing reached the client yet, so another replica may answer
            if isinstance(e, (ClientGone, ShuttingDown)):
                # The engine may have read the prompt: that much is billed.
                status = 499 if isinstance(e, ClientGone) else e.status
                settle(reservation, *_billed(None, None, status, reservation), status, endpoint)
                if isinstance(e, ClientGone):
                    raise
                return error(e.status, f"The replica did not answer: {e}.", "server_error", e.code,
                             headers=_ids(reservation))
            raise
        if upstream.status in (401, 403):
            # The engine refused the key the gateway sent it, never the client's: its key
            # rotated after this worker read the routes, or the model's own arguments set
            # another. Not the client's fault; another replica may take it.
            upstream.finish(False)
            routes.inflight[endpoint] -= 1
            last = f"a replica refused the key the gateway gave it ({upstream.status})"
            continue
        reservation.endpoint = endpoint
        if stream:
            return _relay(upstream, endpoint, routes, reservation, tap, settle, deadline, g)
        return _whole(upstream, endpoint, routes, reservation, settle, deadline, g)
    settle(reservation, 0, 0, 502)
    return error(502, f"No replica answered ({last}).", "server_error", "upstream_unreachable",
                 headers=_ids(reservation))


def _ids(reservation):
    # Which model served it (a fallback, maybe), and the id its usage row is found by.
    return {"X-Llmgw-Model": reservation.model, "X-Request-Id": reservation.request_id}


def _headers(upstream, reservation):
    return {"Content-Type": upstream.headers.get("Content-Type", "application/json"),
            "X-Accel-Buffering": "no", "Cache-Control": "no-cache", **_ids(reservation)}


def _read(upstream, deadline, g, first=False):
    """Return what has arrived from upstream (b"" at the end), within the timeouts: the first
    byte of a stream's body, the gap between bytes, and the whole answer."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise _too_long(g)
    wait, setting = (g["first_byte_timeout"], "first_byte_timeout") if first else \
        (g["read_timeout"], "read_timeout")
    upstream.set_read_timeout(min(wait, left))
    try:
        # read1 returns what has arrived instead of waiting for a full buffer.
        return upstream.read1(65536)
    except ReadTimedOut as e:
        if deadline - time.monotonic() <= 0.05:
            raise _too_long(g) from e
        raise UpstreamFailed(f"the replica sent nothing for {wait:g} s (gateway.{setting})", 504,
                             "upstream_timeout") from e
    except Broken as e:
        raise UpstreamFailed(f"the connection to the replica broke ({e})", 502,
                             "upstream_broken") from e


def _too_long(g):
    return UpstreamFailed(f"the answer took longer than {g['generation_timeout']:g} s "
                          f"(gateway.generation_timeout)", 504, "upstream_timeout")


def _whole(upstream, endpoint, routes, reservation, settle, deadline, g):
    """A response that is not a stream: read it all, then answer (or say why not)."""
    status, usage, complete = upstream.status, None, False
    try:
        parts = []
        while chunk := _read(upstream, deadline, g):
            parts.append(chunk)
        content, complete = b"".join(parts), True
        usage = _usage_of(content)
    except UpstreamFailed as e:
        status = e.status
        return error(e.status, f"The replica did not finish: {e}.", "server_error", e.code,
                     headers=_ids(reservation))
    except ClientGone:
        status = 499
        raise
    finally:
        upstream.finish(complete)
        routes.inflight[endpoint] -= 1
        settle(reservation, *_billed(usage, None, status, reservation), status, endpoint)
    return Response(content, status=status, headers=_headers(upstream, reservation))


def _relay(upstream, endpoint, routes, reservation, tap, settle, deadline, g):
    status = upstream.status
    ended = []

    def end(outcome):
        """Once, however the stream ends: keep or close the engine's connection (closing it
        stops generation), count the endpoint down, settle."""
        if ended:
            return
        ended.append(outcome)
        try:
            upstream.finish(outcome == status)
        finally:
            routes.inflight[endpoint] -= 1
            settle(reservation, *_billed(tap.usage, tap, outcome, reservation), outcome, endpoint)

    def body():
        outcome = 499  # until the end is reached, the client went away
        relaying = _relaying()
        relaying.__enter__()  # the generator runs in the request's greenlet: interruptible
        try:
            # Engines send a stream's headers at once and its first bytes after reading the
            # prompt: the first read is what first_byte_timeout bounds.
            chunk = _read(upstream, deadline, g, first=True)
            reservation.first_at = time.monotonic()
            while chunk:
                out = tap.feed(chunk)
                if out:
                    yield out
                chunk = _read(upstream, deadline, g)
            rest = tap.flush()
            if rest:
                yield rest
            if status == 200 and not tap.done:
                # A stream closed without its [DONE]: the engine died (or was killed) mid-way.
                raise UpstreamFailed("the replica closed the stream before its end", 502,
                                     "upstream_broken")
            outcome = status
        except UpstreamFailed as e:
            outcome = e.status
            # Mid-stream, the status has gone: OpenAI's clients read an error event instead.
            event = {"error": {"message": f"The replica did not finish: {e}.", "type": "server_error",
                               "param": None, "code": e.code}}
            yield b"data: " + json.dumps(event).encode() + b"\n\n"
        finally:
            relaying.__exit__(None, None, None)
            end(outcome)

    try:
        response = Response(stream_with_context(body()), status=status,
                            headers=_headers(upstream, reservation))
    except BaseException:
        end(502)
        raise
    # A response closed before its body began (the client left while its headers were sent)
    # never runs the generator's `finally`: closing the response ends it all the same.
    response.call_on_close(lambda: end(499))
    return response


def _usage_of(content):
    try:
        usage = json.loads(content).get("usage")
    except (ValueError, AttributeError):
        return None
    return usage if isinstance(usage, dict) else None


def _billed(usage, tap, status, res):
    """Return (prompt, completion) tokens to bill: what the engine says it used; without its
    word, the prompt's estimate and what was seen to be generated (a stream cut short by the
    client, a timeout or a broken engine). Never more than was reserved: an engine that
    ignores the cap it was sent is not a way past a limit."""
    if usage:
        prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    elif tap is not None and (status < 400 or status in (499, 502, 503, 504)):
        prompt, completion = res.prompt_estimate, tap.content_events
    elif tap is None and status in (499, 503):
        prompt, completion = res.prompt_estimate, 0  # a whole answer given up: its prompt was read
    else:
        return 0, 0
    if res.prompt_reserved or res.completion_reserved:
        prompt, completion = min(prompt, res.prompt_reserved), min(completion, res.completion_reserved)
    return prompt, completion


def _count(value):
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0  # an engine's nonsense is not a reason to lose the usage row
