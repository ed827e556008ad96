"""Which endpoint serves a request: least outstanding first, sticky per session while fair. Pure."""
import hashlib

# A session stays on its endpoint while that endpoint has at most this many times the
# outstanding requests of the least loaded one (plus one, so an idle pool stays sticky).
AFFINITY_FACTOR = 2.0


def order(endpoints, inflight, turn, session=""):
    """Return endpoints in the order to try them.

    inflight: outstanding requests per endpoint (this worker's own, plus what the engine last
    reported of its running and queued requests). Least first, ties rotated by turn; with a session key (the request's
    `user` field or an X-Session-Id header) its own endpoint leads while within the factor.
    """
    if not endpoints:
        return []
    n = len(endpoints)
    ranked = sorted(endpoints, key=lambda e: (inflight.get(e, 0), (endpoints.index(e) - turn) % n))
    if not session or n == 1:
        return ranked
    home = endpoints[int(hashlib.sha256(session.encode()).hexdigest(), 16) % n]
    least = inflight.get(ranked[0], 0)
    if inflight.get(home, 0) <= least * AFFINITY_FACTOR + 1:
        return [home] + [e for e in ranked if e != home]
    return ranked
