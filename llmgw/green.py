"""Work that must not run on gevent's hub in the gunicorn workers."""
import sys


def off_the_hub(fn, *args):
    """Run CPU-heavy work (a password hash, a placement explained) in gevent's thread pool when
    this process is a gevent worker, so every other request of the worker goes on meanwhile;
    call it directly anywhere else (a command, a test)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is None or not monkey.is_module_patched("threading"):
        return fn(*args)
    from gevent import get_hub
    return get_hub().threadpool.apply(fn, args)
