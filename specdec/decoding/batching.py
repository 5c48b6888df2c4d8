"""Concurrent sequences' calls gathered into batches, one batch in flight at a time.

Calls made in one event-loop turn go together, and calls made while a batch runs go together
when it returns. Sequences whose calls return together call again in the same turn (the loop
awaits nothing else between a verdict and its next verification), so a round's calls stay one
batch, round after round, as in a GPU engine's continuous batching. In process (local.py) the
engine call blocks the event loop; served (serving/bls.py) a batch is one Triton request of
many rows: separate requests reach Triton's dynamic batcher apart, and the round trips put
sequences out of step (docs/benchmarks.md, "Served at simulated H100 step times").

A burst of new prompts can go in pieces (max_prefill): the first of them reach their first
token before the last is prefilled, and running sequences never wait for a prefill to finish.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable


class Batcher:
    def __init__(self, run: Callable[[list], Awaitable[list]], max_rows: int | None = None,
                 max_prefill: int | None = None, prefill: Callable[[object], int] = lambda c: 0):
        self.run = run                 # calls -> a result or an exception per call
        self.max_rows = max_rows       # a batch's most calls (the rest go next)
        # A batch's most prefill(call) tokens, past its first call that has any (a prompt
        # longer goes alone); calls with none always go. None: no limit.
        self.max_prefill = max_prefill
        self.prefill = prefill
        self.pending: list[tuple[object, asyncio.Future]] = []
        self.busy = False              # a batch is in flight
        self.in_flight: asyncio.Future | None = None

    async def submit(self, call):
        """The call's result; raises the exception its batch gave for it."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.pending.append((call, fut))
        if len(self.pending) == 1 and not self.busy:
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        if self.busy or not self.pending:
            return
        batch, self.pending = self._take(self.pending)
        self.busy = True
        # Held: the event loop keeps only a weak reference to a task.
        self.in_flight = asyncio.ensure_future(self._send(batch))

    def _take(self, pending: list) -> tuple[list, list]:
        """The next batch and the calls that wait, both in the order they came (prompts are
        taken first come, first served)."""
        rows = len(pending) if self.max_rows is None else self.max_rows
        if self.max_prefill is None:
            return pending[:rows], pending[rows:]
        take, wait, tokens, full = [], [], 0, False
        for item in pending:
            n = self.prefill(item[0])
            if n and not full and tokens and tokens + n > self.max_prefill:
                full = True   # and every later prompt waits too: none overtakes another
            if len(take) < rows and (n == 0 or not full):
                take.append(item)
                tokens += n
            else:
                wait.append(item)
        return take, wait

    async def _send(self, batch: list[tuple[object, asyncio.Future]]) -> None:
        try:
            results = await self.run([c for c, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{len(results)} results for {len(batch)} calls")
        except asyncio.CancelledError:   # the event loop is closing: nobody waits
            self.busy = False
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:   # the whole batch failed: every caller hears it, none waits
            results = [exc] * len(batch)
        self.busy = False
        for (_, fut), result in zip(batch, results):
            if fut.cancelled():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
        # After the callers' wake-ups: those that call again join the calls made meanwhile.
        if self.pending:
            asyncio.get_running_loop().call_soon(self._flush)
