"""The orchestrator's messages to the server process that nothing waits for: streamed responses
and metric updates, sent in the order they were posted, from one thread of their own.

Each is a round trip from the backend stub to the server process, made with the GIL released
(Triton 2.51's python_backend, response_sender.cc and metric.cc). Made on the event loop, at 16
streams they were a third of its time (py-spy: the sends 25-30 %, histogram observations 13 %)
and every generation's next call waited behind them; on this thread the loop goes on while they
travel (docs/benchmarks.md, "Responses and metrics off the event loop").
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

log = logging.getLogger("specdec")

# False: post() runs each message at once, on the caller's thread (the adapter tests, whose fake
# requests decide by the responses sent so far).
THREADED = True


class Courier:
    def __init__(self, threaded: bool | None = None):
        threaded = THREADED if threaded is None else threaded
        # One thread: one order, so a request's responses, and the counters its final response
        # promises a client, arrive as they were posted.
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="courier") if threaded else None

    def post(self, fn: Callable, *args, **kwargs) -> None:
        """fn(*args, **kwargs) after everything posted before it; a failure is logged, not
        raised: the caller has moved on (a request whose client is gone ends on its
        cancellation)."""
        if self._pool is None:
            fn(*args, **kwargs)
            return
        self._pool.submit(fn, *args, **kwargs).add_done_callback(_log_failure)

    async def settle(self) -> None:
        """Returns once everything posted before it was done."""
        if self._pool is not None:
            await asyncio.wrap_future(self._pool.submit(lambda: None))


def _log_failure(future: Future) -> None:
    exc = future.exception()
    if exc is not None:
        log.error("specdec: a response or metric update failed to send: %s", exc)
