"""The orchestrator's messages to the server process that nothing waits for: streamed responses
and metric updates, sent in the order they were posted, from one thread of their own.

Each is a round trip from the backend stub to the server process, made with the GIL released
(Triton 2.51's python_backend, response_sender.cc and metric.cc). Made on the event loop, at 16
streams they were a third of its time (py-spy: the sends 25-30 %, histogram observations 13 %)
and every generation's next call waited behind them; on this thread the loop goes on while they
travel (docs/benchmarks.md, "Responses and metrics off the event loop"). A post is a put on a
queue: a ThreadPoolExecutor's submit (a Future, a lock, its thread-count check) cost the loop
about 15 us a post, and a 16-stream round posts a response and several metric updates a row.
"""
from __future__ import annotations

import asyncio
import ctypes
import logging
import queue
import threading
from typing import Callable

log = logging.getLogger("specdec")

# False: post() runs each message at once, on the caller's thread (the adapter tests, whose fake
# requests decide by the responses sent so far).
THREADED = True
# Also the thread's name for the OS (top -H, /proc/<pid>/task/*/comm; at most 15 bytes), where
# benchmarks/courier_load.py finds it.
THREAD_NAME = "specdec-courier"


class Courier:
    def __init__(self, threaded: bool | None = None):
        threaded = THREADED if threaded is None else threaded
        # One thread: one order, so a request's responses, and the counters its final response
        # promises a client, arrive as they were posted.
        self._queue: queue.SimpleQueue | None = queue.SimpleQueue() if threaded else None
        self._held: list[tuple] = []   # posted this event-loop turn (post)
        self._held_on: asyncio.AbstractEventLoop | None = None   # that turn's loop
        if self._queue is not None:
            threading.Thread(target=self._run, name=THREAD_NAME, daemon=True).start()

    def post(self, fn: Callable, *args, **kwargs) -> None:
        """fn(*args, **kwargs) after everything posted before it; a failure is logged, not
        raised: the caller has moved on (a request whose client is gone ends on its
        cancellation).

        Posted on an event loop, it is held until the callbacks already waiting there have
        run. A round's rows go on one after another, each posting its response as it takes
        its verdict, and the courier's Python (each response's tensors, under the GIL) slowed
        the rows still to go; released after them, it runs while the batch they made is on
        the device. 16 streams at the H200's step times x 4: a served round cost 0.37 ms more
        than in process, 0.26 with the hold (four interleaved pairs; docs/benchmarks.md,
        "Responses held to the end of the loop's turn"). A response leaves after the rows
        behind it in that turn have gone on, a fraction of a millisecond, every response
        alike: the gaps between a stream's tokens stay."""
        if self._queue is None:
            fn(*args, **kwargs)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:      # off any event loop: at once
            self._queue.put((fn, args, kwargs))
            return
        if self._held and self._held_on is not loop:
            self._release()   # held on a loop that closed before it released them
        self._held.append((fn, args, kwargs))
        if len(self._held) == 1:
            self._held_on = loop
            loop.call_soon(self._release)

    def _release(self) -> None:
        held, self._held, self._held_on = self._held, [], None
        for message in held:
            self._queue.put(message)

    async def settle(self) -> None:
        """Returns once everything posted before it was done."""
        if self._queue is None:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self.post(loop.call_soon_threadsafe, _resolve, done)
        await done

    def _run(self) -> None:
        _name_os_thread(THREAD_NAME)
        while True:
            fn, args, kwargs = self._queue.get()
            try:
                fn(*args, **kwargs)
            except Exception as exc:
                log.error("specdec: a response or metric update failed to send: %s", exc)


def _resolve(done: asyncio.Future) -> None:
    if not done.done():   # its waiter may have been cancelled
        done.set_result(None)


def _name_os_thread(name: str) -> None:
    """Python 3.11 names a thread for Python alone; prctl(PR_SET_NAME) names it for the OS too."""
    try:
        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):   # not Linux: the name is only a convenience
        pass
