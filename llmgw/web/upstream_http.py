"""HTTP to the engines: one pool of kept-alive connections per worker.

Plain http:// engines without a proxy (llama-server, vLLM, the simulated ones: the hot path)
go through a small HTTP/1.1 client of our own on the stdlib socket module (which gevent
patches in the workers): one sendall per request, the response head parsed by hand, the body
decoded (Content-Length, chunked, or until close) as it arrives. urllib3 spent a third of a
relayed request's CPU on what this does not need (email-parser headers, pool bookkeeping).

https:// and hosts behind a proxy from the environment (HTTPS_PROXY, NO_PROXY..., decided once
per host) still go through urllib3, behind an adapter with the same response interface:

    status, headers.get(name, default), read1(n), set_read_timeout(seconds), finish(complete)

Both raise only the exceptions of lean_http (UpstreamError and its kinds).
"""
import urllib.parse
import urllib.request

import urllib3
from urllib3.exceptions import HTTPError, ReadTimeoutError

from .lean_http import (CONNECTIONS_PER_HOST, Broken, ConnectFailed, HeadTimeout,  # noqa: F401
                        LeanPool, ReadTimedOut, UpstreamError, keepalive_options)

POOLS_PER_WORKER = 64


class Upstreams:
    def __init__(self):
        self.lean = LeanPool()
        self.direct = None  # urllib3, made on first use (https, proxies)
        self.proxies = urllib.request.getproxies()
        self.via = {}  # (scheme, host) -> the urllib3 pool manager, or None for the lean client
        self.liveness = 0  # gateway.engine_liveness, given with each request

    def _manager(self, scheme, host):
        key = (scheme, host)
        try:
            return self.via[key]
        except KeyError:
            pass
        proxy = self.proxies.get(scheme)
        options = _socket_options(self.liveness)
        if proxy and not urllib.request.proxy_bypass(host or ""):
            manager = urllib3.ProxyManager(proxy, num_pools=POOLS_PER_WORKER,
                                           maxsize=CONNECTIONS_PER_HOST, socket_options=options)
        elif scheme == "http":
            manager = None
        else:
            if self.direct is None:
                self.direct = urllib3.PoolManager(num_pools=POOLS_PER_WORKER,
                                                  maxsize=CONNECTIONS_PER_HOST, socket_options=options)
            manager = self.direct
        self.via[key] = manager
        return manager

    def post(self, url, data, headers, connect_timeout, read_timeout, liveness=0):
        """Send a POST; return the response with its body unread. read_timeout bounds the wait
        for the response head; liveness, how long the peer's host may acknowledge nothing.
        Raises ConnectFailed or HeadTimeout."""
        target = self.lean.target(url)
        self.liveness = liveness  # for the urllib3 pools made from now on
        manager = self._manager(target[0], target[1])
        if manager is None:
            return self.lean.post(target, data, headers, connect_timeout, read_timeout, liveness)
        try:
            return Urllib3Response(manager.urlopen(
                "POST", url, body=data, headers=headers, preload_content=False, retries=False,
                redirect=False, timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout)))
        except ReadTimeoutError as e:
            raise HeadTimeout(str(e)) from e
        except (HTTPError, OSError) as e:
            raise ConnectFailed(str(e)) from e


# --- urllib3 (https, proxies) ------------------------------------------------------------------

def _socket_options(liveness):
    """urllib3's socket options with the same keepalive bound as the lean client's sockets."""
    from urllib3.connection import HTTPConnection
    return list(HTTPConnection.default_socket_options) + keepalive_options(liveness)


class Urllib3Response:
    __slots__ = ("raw", "status", "headers", "_sock")

    def __init__(self, raw):
        self.raw, self.status, self.headers, self._sock = raw, raw.status, raw.headers, False

    def set_read_timeout(self, seconds):
        if self._sock is False:
            self._sock = _socket_of(self.raw)
        if self._sock is not None:
            self._sock.settimeout(seconds)

    def read1(self, n):
        try:
            # read1 returns what has arrived instead of waiting for a full buffer.
            return self.raw.read1(n, decode_content=True)
        except (ReadTimeoutError, TimeoutError) as e:
            raise ReadTimedOut(str(e)) from e
        except (HTTPError, OSError) as e:
            raise Broken(str(e)) from e

    def finish(self, complete):
        """Give the connection back for the next request when the body was read to its end;
        otherwise close it (which is also what tells an engine to stop generating)."""
        if not complete:
            self.raw.close()
        self.raw.release_conn()


def _socket_of(raw):
    """Return the socket a urllib3 response is read from, to set its timeout as it goes on."""
    sock = getattr(raw.connection, "sock", None)
    if sock is None:  # a response that closes its connection keeps the socket itself
        fp = getattr(getattr(raw, "_fp", None), "fp", None)
        sock = getattr(getattr(fp, "raw", None), "_sock", None)
    return sock


