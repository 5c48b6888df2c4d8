"""In-process Drafter and Verifier over an Engine, batched as the served verifier is.

Calls issued by concurrent sequences in the same event-loop turn run as one batched engine call
(batching.py). Used by tests and benchmarks without a server.
"""
from __future__ import annotations

from .batching import Batcher
from ..runtime.engine import Engine
from ..records import Proposal, ProposeCall, Verdict, VerifyCall


class _Local:
    def __init__(self, engine: Engine, run):
        self.engine = engine

        async def run_async(calls: list) -> list:   # blocks the event loop, as a device would not
            return run(calls)
        self.batcher = Batcher(run_async)

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
