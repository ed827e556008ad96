"""HTTP to the engines: one pool of kept-alive connections per worker, straight on urllib3.

requests cost a third of a relayed request's CPU (it re-reads the proxy environment and
re-prepares every request); the gateway needs none of what it adds. Proxies from the
environment (HTTPS_PROXY, NO_PROXY...) are still honoured, decided once per host.
"""
import urllib.parse
import urllib.request

import urllib3

POOLS_PER_WORKER = 64
CONNECTIONS_PER_HOST = 1024


class Upstreams:
    def __init__(self):
        self.direct = urllib3.PoolManager(num_pools=POOLS_PER_WORKER, maxsize=CONNECTIONS_PER_HOST)
        self.proxies = urllib.request.getproxies()
        self.via = {}  # (scheme, host) -> the pool manager to use

    def _manager(self, url):
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.hostname)
        manager = self.via.get(key)
        if manager is None:
            proxy = self.proxies.get(parts.scheme)
            if proxy and not urllib.request.proxy_bypass(parts.hostname or ""):
                manager = urllib3.ProxyManager(proxy, num_pools=POOLS_PER_WORKER,
                                               maxsize=CONNECTIONS_PER_HOST)
            else:
                manager = self.direct
            self.via[key] = manager
        return manager

    def post(self, url, data, headers, connect_timeout, read_timeout):
        """Send a POST; return the urllib3 response with its body unread (raises urllib3 errors)."""
        return self._manager(url).urlopen(
            "POST", url, body=data, headers=headers, preload_content=False, retries=False,
            redirect=False, timeout=urllib3.Timeout(connect=connect_timeout, read=read_timeout))


def finish(response, complete):
    """Give the connection back for the next request when the body was read to its end;
    otherwise close it (which is also what tells an engine to stop generating)."""
    if complete:
        response.release_conn()
    else:
        response.close()
        response.release_conn()
