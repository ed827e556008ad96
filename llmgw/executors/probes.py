"""HTTP probes of engines and endpoints, on threads of their own.

asyncio.to_thread shares the loop's default pool (a few threads: min(32, CPUs + 4)) with the
long blocking work of the reconciler: downloading a release, hashing or copying weights. A probe
queued behind those waited minutes, long enough for a serving replica to be taken for dead.
Probes are short (seconds at most, by their own timeouts) and get this pool to themselves.
"""
import asyncio
import functools
from concurrent.futures import ThreadPoolExecutor

THREADS = 32
_pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="llmgw-probe")


async def probe(fn, *args):
    """Run fn(*args), a blocking HTTP probe, on the probe threads; return its result."""
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args))
