"""A small HTTP/1.1 client for plain http:// engines: the gateway's hot path.

One sendall per request; the response parsed by llhttp (Node.js's parser, through httptools)
as it arrives, head and body (Content-Length, chunked, or until close); idle kept-alive sockets
pooled per (host, port). It is built on the stdlib socket module, which gevent patches in the
workers. urllib3 spent a third of a relayed request's CPU on what this does not need
(email-parser headers, pool bookkeeping); upstream_http.py keeps urllib3 for https and proxies.

llhttp refuses what HTTP/1.1 forbids and a hand-written parser let through or waited on: a
Content-Length that is not ASCII digits (or given twice), Transfer-Encoding together with
Content-Length, folded header lines, lines ended by a bare LF, bad chunk framing. Such a
response fails at once, as a protocol error, instead of being misread or timing out.
"""
import errno
import socket
import time
import urllib.parse

import httptools

MAX_HEAD = 65536
RECV = 65536
CONNECTIONS_PER_HOST = 1024
IDLE_SECONDS = 60  # an idle pooled socket older than this is closed
SWEEP_SECONDS = 5  # how often idle sockets are checked for a peer that closed them


class UpstreamError(Exception):
    """Something went wrong talking to a replica."""


class ConnectFailed(UpstreamError):
    """No response came: refused, unreachable, closed or reset before its head, or a head that
    is not HTTP. Nothing reached the client, so another replica may be tried."""


class HeadTimeout(UpstreamError):
    """The replica took the request but sent no response head in time. It may be working on
    it: another replica would do it twice."""


class ReadTimedOut(UpstreamError):
    """Nothing arrived within the read timeout while reading the body."""


class Broken(UpstreamError):
    """The connection broke (or the framing went wrong) while reading the body."""



class Headers:
    """Response headers: names case-insensitive, repeated ones joined with ", "."""
    __slots__ = ("_d",)

    def __init__(self, d):
        self._d = d

    def get(self, name, default=None):
        return self._d.get(name.lower(), default)

    def __contains__(self, name):
        return name.lower() in self._d

    def __repr__(self):
        return f"Headers({self._d!r})"


_RESET = (errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED, errno.ENOTCONN)


def keep_alive(sock, liveness):
    """Make a connection give up once its peer's host acknowledges nothing for `liveness` s.

    A node whose network went silent (packets dropped, not refused) left requests waiting for a
    first byte, or in the middle of a stream, until TCP gave up on its own: one took 958 s.
    Keepalive probes go out while a connection waits (an engine working on a long prompt still
    has its kernel answer them), and TCP_USER_TIMEOUT bounds both unanswered probes and unsent
    data; the next read then fails with ETIMEDOUT. Set once per connection, not per request.
    """
    try:
        for level, option, value in keepalive_options(liveness):
            sock.setsockopt(level, option, value)
    except OSError:
        pass


def _host_silent(error):
    """Return whether an error is the kernel giving up on a silent peer (keep_alive's bound).

    Python raises it as TimeoutError, as it does a socket timeout, but with errno ETIMEDOUT set.
    """
    return getattr(error, "errno", None) == errno.ETIMEDOUT


def keepalive_options(liveness):
    """Return the (level, option, value) socket options for keep_alive(); none off Linux."""
    if not liveness or not hasattr(socket, "TCP_USER_TIMEOUT"):
        return []
    probe = max(1, int(liveness) // 4)
    return [(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
            (socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, probe),
            (socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, probe),
            (socket.IPPROTO_TCP, socket.TCP_KEEPCNT, max(1, int(liveness) // probe)),
            (socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(liveness * 1000))]


def _usable(sock):
    """Whether an idle socket can carry a request: not closed by its peer, nothing unasked
    for waiting on it."""
    try:
        sock.settimeout(0.0)
        sock.recv(1, socket.MSG_PEEK)  # EOF, or bytes nobody asked for: not usable
    except BlockingIOError:
        return True  # nothing to read and not closed: alive
    except OSError:
        pass
    return False


class _Dead(Exception):
    """A connection closed or reset before the first byte of the response head."""


class LeanPool:
    """Idle kept-alive sockets per (host, port), for one worker (its greenlets share them)."""

    def __init__(self, per_host=CONNECTIONS_PER_HOST):
        self.idle = {}  # (host, port) -> [socket], the last one idle first out
        self.since = {}  # socket -> when it was given back
        self.per_host = per_host
        self.targets = {}  # url -> (scheme, host, port, head prefix); urls are few
        self.swept = time.monotonic()
        self.sweep_every = SWEEP_SECONDS

    def target(self, url):
        got = self.targets.get(url)
        if got is None:
            parts = urllib.parse.urlsplit(url)
            host, port = parts.hostname or "", parts.port
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            if port is None:
                port = 443 if parts.scheme == "https" else 80
            shown = f"[{host}]" if ":" in host else host
            if port != (443 if parts.scheme == "https" else 80):
                shown = f"{shown}:{port}"
            prefix = f"POST {path} HTTP/1.1\r\nHost: {shown}\r\nAccept-Encoding: identity\r\n"
            got = (parts.scheme, host, port, prefix.encode("latin-1"))
            if len(self.targets) > 4096:
                self.targets.clear()
            self.targets[url] = got
        return got

    def _take(self, key):
        """Return an idle socket for key that looks alive, or None."""
        idle = self.idle.get(key)
        now = time.monotonic()
        while idle:
            sock = idle.pop()
            if now - self.since.pop(sock, now) < IDLE_SECONDS and _usable(sock):
                return sock
            sock.close()
        return None

    def give_back(self, key, sock):
        idle = self.idle.get(key)
        if idle is None:
            idle = self.idle[key] = []
        if len(idle) < self.per_host:
            idle.append(sock)
            self.since[sock] = time.monotonic()
        else:
            sock.close()

    def sweep(self, now=None):
        """Close idle sockets that their engine closed (each would wait in CLOSE_WAIT until
        taken, for ever for an engine no longer asked) or that waited past IDLE_SECONDS.
        Run by requests, at most every sweep_every seconds."""
        now = now or time.monotonic()
        self.swept = now
        for key, idle in list(self.idle.items()):
            kept = []
            for sock in idle:
                if now - self.since.get(sock, now) < IDLE_SECONDS and _usable(sock):
                    kept.append(sock)
                else:
                    self.since.pop(sock, None)
                    sock.close()
            if kept:
                self.idle[key] = kept
            else:
                del self.idle[key]

    def post(self, target, data, headers, connect_timeout, head_timeout, liveness=0):
        _, host, port, prefix = target
        head = [prefix]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"Content-Length: %d\r\n\r\n" % len(data))
        request = b"".join(head) + data
        key = (host, port)
        if time.monotonic() - self.swept >= self.sweep_every:
            self.sweep()
        sock = self._take(key)
        if sock is not None:
            try:
                return self._exchange(key, sock, request, head_timeout)
            except _Dead:
                pass  # the engine closed it while idle: once more on a fresh connection
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as e:  # socket.timeout included
            raise ConnectFailed(f"cannot connect to {host}:{port}: {e}") from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        keep_alive(sock, liveness)
        try:
            return self._exchange(key, sock, request, head_timeout)
        except _Dead as e:
            raise ConnectFailed(f"{host}:{port} closed the connection without answering") from e

    def _exchange(self, key, sock, request, head_timeout):
        """Send the request and read the response head; return the LeanResponse."""
        deadline = time.monotonic() + head_timeout
        msg, heard = _Message(), False
        try:
            sock.settimeout(head_timeout)
            sock.sendall(request)
            while True:
                data = sock.recv(RECV)
                if not data:
                    if heard:
                        raise ConnectFailed("the replica closed the connection within the "
                                            "response head")
                    raise _Dead()
                heard = True
                try:
                    msg.feed(data)
                except httptools.HttpParserError as e:
                    raise _not_http(e) from None
                if msg.head_done:
                    return LeanResponse(self, key, sock, msg)
                if msg.head_bytes > MAX_HEAD:
                    raise ConnectFailed("the response head is too long")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise socket.timeout("timed out")
                sock.settimeout(left)
        except (_Dead, ConnectFailed):
            sock.close()
            raise
        except OSError as e:
            sock.close()
            if _host_silent(e):
                # Its answer could not reach us whatever it is doing: another replica may try.
                raise ConnectFailed("its host stopped acknowledging packets "
                                    "(gateway.engine_liveness)") from e
            if isinstance(e, socket.timeout):
                raise HeadTimeout(f"no response head within {head_timeout:g} s") from e
            if not heard and e.errno in _RESET:
                raise _Dead() from e
            raise ConnectFailed(f"the connection failed: {e}") from e
        except BaseException:
            sock.close()  # interrupted (the client left, the worker stops): the engine stops too
            raise


class _Message:
    """httptools' callbacks for one response: its head, and body bytes as they are parsed.

    Interim 1xx responses are skipped. Callbacks only record: an exception raised in one
    would come back from feed_data wrapped."""
    __slots__ = ("parser", "status", "fields", "head_done", "keep", "framed", "body", "complete",
                 "after", "head_bytes", "error")

    def __init__(self):
        self.parser = httptools.HttpResponseParser(self)
        self.status, self.fields, self.head_done, self.keep, self.framed = 0, {}, False, False, False
        self.body, self.complete, self.after, self.head_bytes, self.error = [], False, False, 0, None

    def on_message_begin(self):
        if self.complete:
            self.after = True  # bytes after the end: no telling what they are

    def on_header(self, name, value):
        name = name.decode("latin-1").lower()
        value = value.decode("latin-1").strip()
        fields = self.fields
        fields[name] = f"{fields[name]}, {value}" if name in fields else value

    def on_headers_complete(self):
        status = self.parser.get_status_code()
        if status < 200:
            self.fields = {}  # an interim response: the real one follows
            return
        self.status, self.head_done = status, True
        te = self.fields.get("transfer-encoding", "")
        chunked = te.rsplit(",", 1)[-1].strip().lower() == "chunked"
        self.framed = chunked or (not te and "content-length" in self.fields) or status in (204, 304)
        # Without a length or chunks the body ends when the connection does.
        self.keep = self.framed and self.parser.should_keep_alive()

    def on_body(self, body):
        if not self.after:
            self.body.append(body)

    def on_message_complete(self):
        if self.head_done and not self.complete:
            self.complete = True

    def feed(self, data):
        """Parse what arrived. What HTTP/1.1 forbids raises httptools.HttpParserError within
        the head; within the body it is kept in `error`, for after the body parsed before it."""
        if self.after or self.error:
            return
        if not self.head_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:  # HttpParserUpgrade included
            if self.complete:
                self.after = True  # junk after a whole response: the connection is not reused
            elif self.head_done:
                self.error = str(e) or type(e).__name__
            else:
                raise


def _not_http(e):
    return ConnectFailed(f"the replica's response is not valid HTTP/1.1 ({e})")


class LeanResponse:
    """A response whose body is read as it arrives."""
    __slots__ = ("status", "headers", "_pool", "_key", "_sock", "_msg", "_timeout", "_applied")

    def __init__(self, pool, key, sock, msg):
        self._pool, self._key, self._sock, self._msg = pool, key, sock, msg
        self.status, self.headers = msg.status, Headers(msg.fields)
        self._timeout = self._applied = None

    def set_read_timeout(self, seconds):
        """Bound each wait for more of the body (applied when a wait is needed)."""
        self._timeout = seconds

    def _recv(self, n):
        sock = self._sock
        if sock is None:
            raise Broken("the response was already finished")
        if self._timeout != self._applied:
            sock.settimeout(self._timeout)
            self._applied = self._timeout
        try:
            return sock.recv(n)
        except OSError as e:
            if _host_silent(e):
                raise Broken("its host stopped acknowledging packets (gateway.engine_liveness)") from e
            if isinstance(e, socket.timeout):
                raise ReadTimedOut(f"nothing arrived for {self._timeout:g} s") from e
            raise Broken(str(e)) from e

    def read1(self, n=RECV):
        """Return the body bytes that have arrived (waiting only when none have; at most what
        one read brings); b"" at its end. Raises ReadTimedOut or Broken."""
        msg = self._msg
        while True:
            body = msg.body
            if body:
                out = body[0] if len(body) == 1 else b"".join(body)
                msg.body = [out[n:]] if len(out) > n else []
                return out[:n] if len(out) > n else out
            if msg.error:
                raise Broken(f"the body's framing is not valid HTTP/1.1 ({msg.error})")
            if msg.complete:
                return b""
            data = self._recv(RECV)
            if not data:
                if not msg.framed:
                    msg.complete = True  # the body ends with the connection
                    return b""
                raise Broken("the connection closed before the end of the body")
            msg.feed(data)

    def finish(self, complete):
        """Give the connection back for the next request when the body was read to its end;
        otherwise close it (which is also what tells an engine to stop generating)."""
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        msg = self._msg
        if complete and msg.complete and msg.keep and not msg.after and not msg.body:
            self._pool.give_back(self._key, sock)
        else:
            sock.close()
