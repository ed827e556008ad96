"""A small HTTP/1.1 client for plain http:// engines: the gateway's hot path.

One sendall per request, the response head parsed by hand, the body decoded (Content-Length,
chunked, or until close) as it arrives, idle kept-alive sockets pooled per (host, port). It is
built on the stdlib socket module, which gevent patches in the workers. urllib3 spent a third of
a relayed request's CPU on what this does not need (email-parser headers, pool bookkeeping);
upstream_http.py keeps urllib3 for https and proxies.
"""
import errno
import socket
import time
import urllib.parse

MAX_HEAD = 65536
RECV = 65536
CONNECTIONS_PER_HOST = 1024


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


class _Dead(Exception):
    """A connection closed or reset before the first byte of the response head."""


class LeanPool:
    """Idle kept-alive sockets per (host, port), for one worker (its greenlets share them)."""

    def __init__(self, per_host=CONNECTIONS_PER_HOST):
        self.idle = {}  # (host, port) -> [socket], the last one idle first out
        self.per_host = per_host
        self.targets = {}  # url -> (scheme, host, port, head prefix); urls are few

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
        while idle:
            sock = idle.pop()
            try:
                sock.settimeout(0.0)
                sock.recv(1, socket.MSG_PEEK)  # EOF, or bytes nobody asked for: not usable
            except BlockingIOError:
                return sock  # nothing to read and not closed: alive
            except OSError:
                pass
            sock.close()
        return None

    def give_back(self, key, sock):
        idle = self.idle.get(key)
        if idle is None:
            idle = self.idle[key] = []
        if len(idle) < self.per_host:
            idle.append(sock)
        else:
            sock.close()

    def post(self, target, data, headers, connect_timeout, head_timeout, liveness=0):
        _, host, port, prefix = target
        head = [prefix]
        for name, value in headers.items():
            head.append(f"{name}: {value}\r\n".encode("latin-1"))
        head.append(b"Content-Length: %d\r\n\r\n" % len(data))
        request = b"".join(head) + data
        key = (host, port)
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
        buf, heard = b"", False
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
                buf += data
                while (end := buf.find(b"\r\n\r\n")) >= 0:
                    response = _parse_head(self, key, sock, buf, end)
                    if response is not None:
                        return response
                    buf = buf[end + 4:]  # an interim 1xx response: the real one follows
                if len(buf) > MAX_HEAD:
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


def _parse_head(pool, key, sock, buf, end):
    """Return the LeanResponse for the head in buf[:end], or None for an interim 1xx one."""
    lines = buf[:end].split(b"\r\n")
    try:
        version, code = lines[0].split(None, 2)[:2]
        status = int(code)
    except ValueError:
        raise ConnectFailed(f"not an HTTP response: {lines[0][:80]!r}") from None
    if not version.startswith(b"HTTP/1.") or not 100 <= status <= 999:
        raise ConnectFailed(f"not an HTTP/1 response: {lines[0][:80]!r}")
    if status < 200:
        return None
    fields = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue  # (obsolete line folding, junk): ignored
        name = name.strip().decode("latin-1").lower()
        value = value.strip().decode("latin-1")
        if name in fields:
            fields[name] = f"{fields[name]}, {value}"
        else:
            fields[name] = value
    keep = version == b"HTTP/1.1"
    connection = fields.get("connection")
    if connection is not None:
        tokens = {t.strip().lower() for t in connection.split(",")}
        if "close" in tokens:
            keep = False
        elif "keep-alive" in tokens and version == b"HTTP/1.0":
            keep = True
    rest = buf[end + 4:]
    te = fields.get("transfer-encoding")
    if status in (204, 304):
        length = 0
    elif te is not None:
        length = None
        if te.rsplit(",", 1)[-1].strip().lower() == "chunked":
            return LeanResponse(pool, key, sock, status, Headers(fields), rest, keep, -1)
        keep = False  # some other coding last: the body ends when the connection does
    else:
        length = None
        cl = fields.get("content-length")
        if cl is not None:
            values = {v.strip() for v in cl.split(",")}
            if len(values) != 1 or not (v := values.pop()).isdigit():
                raise ConnectFailed(f"a bad Content-Length: {cl!r}")
            length = int(v)
    if length is None:
        keep = False  # read until the connection closes
        length = -2
    return LeanResponse(pool, key, sock, status, Headers(fields), rest, keep, length)


# Body states of a chunked response.
_SIZE, _DATA, _CRLF, _TRAILER, _END = range(5)


class LeanResponse:
    """A response whose body is read as it arrives. mode: >= 0 bytes of Content-Length left,
    -1 chunked, -2 until the connection closes."""
    __slots__ = ("status", "headers", "_pool", "_key", "_sock", "_buf", "_pos", "_keep", "_left",
                 "_chunked", "_state", "_done", "_timeout", "_applied")

    def __init__(self, pool, key, sock, status, headers, rest, keep, mode):
        self._pool, self._key, self._sock = pool, key, sock
        self.status, self.headers = status, headers
        self._buf, self._pos, self._keep = rest, 0, keep
        self._chunked = mode == -1
        self._left = mode  # Content-Length left; -2: until close
        self._state = _SIZE
        self._done = mode == 0
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
        """Return up to n bytes of the body that have arrived (waiting only when none have);
        b"" at its end. Raises ReadTimedOut or Broken."""
        if self._done:
            return b""
        if self._chunked:
            return self._read_chunked(n)
        buf, pos = self._buf, self._pos
        left = self._left
        if pos < len(buf):
            take = n if left < 0 else min(n, left)
            out = buf if pos == 0 and take >= len(buf) else buf[pos:pos + take]
            self._pos = pos + len(out)
        else:
            self._buf, self._pos = b"", 0
            out = self._recv(n if left < 0 else min(n, left))
            if not out:
                if left == -2:
                    self._done = True
                    return b""
                raise Broken(f"the connection closed with {left} bytes of the body unread")
        if left >= 0:
            left -= len(out)
            self._left = left
            if left == 0:
                self._done = True
        return out

    def _read_chunked(self, n):
        out = []
        got = 0
        while True:
            buf, pos, state = self._buf, self._pos, self._state
            size = len(buf)
            while pos < size and got < n:
                if state == _DATA:
                    take = min(self._left, n - got, size - pos)
                    out.append(buf[pos:pos + take])
                    got += take
                    pos += take
                    self._left -= take
                    if self._left == 0:
                        state = _CRLF
                elif state == _CRLF:
                    if size - pos < 2:
                        break
                    if buf[pos:pos + 2] != b"\r\n":
                        raise Broken("a chunk does not end with CRLF")
                    pos += 2
                    state = _SIZE
                elif state == _SIZE:
                    eol = buf.find(b"\r\n", pos)
                    if eol < 0:
                        if size - pos > 1024:
                            raise Broken("a chunk size line is too long")
                        break
                    line = buf[pos:eol].split(b";", 1)[0].strip()
                    try:
                        if not line or line[:1] in b"+-":
                            raise ValueError(line)
                        chunk = int(line, 16)
                    except ValueError:
                        raise Broken(f"a bad chunk size {line[:40]!r}") from None
                    pos = eol + 2
                    if chunk:
                        self._left, state = chunk, _DATA
                    else:
                        state = _TRAILER
                elif state == _TRAILER:
                    eol = buf.find(b"\r\n", pos)
                    if eol < 0:
                        if size - pos > MAX_HEAD:
                            raise Broken("the trailer is too long")
                        break
                    empty = eol == pos
                    pos = eol + 2
                    if empty:
                        state = _END
                        break
                else:
                    break
            self._pos, self._state = pos, state
            if state == _END:
                self._done = True
                if pos < size:
                    self._keep = False  # bytes after the end: no telling what they are
                return b"".join(out)
            if got:
                return b"".join(out) if len(out) > 1 else out[0]
            data = self._recv(RECV)
            if not data:
                raise Broken("the connection closed within a chunked body")
            self._buf = buf[pos:] + data if pos < size else data
            self._pos = 0

    def finish(self, complete):
        """Give the connection back for the next request when the body was read to its end;
        otherwise close it (which is also what tells an engine to stop generating)."""
        sock = self._sock
        if sock is None:
            return
        self._sock = None
        if complete and self._done and self._keep and self._pos >= len(self._buf):
            self._pool.give_back(self._key, sock)
        else:
            sock.close()
