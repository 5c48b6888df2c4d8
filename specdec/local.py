"""In-process Drafter and Verifier over an Engine, with Triton-like dynamic batching.

Calls issued by concurrent sequences in the same event-loop turn run as one batched engine call,
as Triton's dynamic batcher would group them. Used by tests and benchmarks without a server.
"""
from __future__ import annotations

import asyncio

from .engine import Engine
from .records import Proposal, ProposeCall, SlotError, Verdict, VerifyCall


class _Batcher:
    def __init__(self, run):
        self.run = run              # list[call] -> list[result | SlotError]
        self.pending: list[tuple[object, asyncio.Future]] = []

    async def submit(self, call):
        fut = asyncio.get_running_loop().create_future()
        self.pending.append((call, fut))
        if len(self.pending) == 1:
            asyncio.get_running_loop().call_soon(self._flush)
        result = await fut
        if isinstance(result, SlotError):
            raise result
        return result

    def _flush(self):
        batch, self.pending = self.pending, []
        try:
            results = self.run([c for c, _ in batch])
        except Exception as exc:   # the whole batch failed: every caller hears it, none waits
            results = [exc] * len(batch)
        for (_, fut), result in zip(batch, results):
            if fut.cancelled():
                continue
            if isinstance(result, Exception) and not isinstance(result, SlotError):
                fut.set_exception(result)
            else:
                fut.set_result(result)


class _Local:
    def __init__(self, engine: Engine, run):
        self.engine = engine
        self.batcher = _Batcher(run)

    async def release(self, seq_id: int) -> None:
        self.engine.release([seq_id])


class LocalDrafter(_Local):
    def __init__(self, engine: Engine):
        super().__init__(engine, engine.propose)

    async def propose(self, call: ProposeCall) -> Proposal:
        return await self.batcher.submit(call)


class LocalVerifier(_Local):
    def __init__(self, engine: Engine):
        super().__init__(engine, engine.verify)

    async def verify(self, call: VerifyCall) -> Verdict:
        return await self.batcher.submit(call)
