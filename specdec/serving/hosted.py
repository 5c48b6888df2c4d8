"""The target's engine in speculative_decoding's process (target_placement "orchestrator").

Separate (the default), a round is a BLS call to target_model: the request crosses into the
server process, waits in the dynamic batcher's queue, crosses into target_model's stub, and its
answer comes back the same way, a few milliseconds a call on top of the engine's (docs/
benchmarks.md). Hosted, the loop calls the engine it holds: a round's verifications, gathered
as the BLS verifier gathers them (batching.py), are one in-process engine call that blocks the
event loop as a device would not, while responses leave from the courier's thread. Whatever
drafts inside the target (a co-located draft model, an EAGLE-3 head, Medusa heads, SWIFT) is
loaded with it, here; a draft in draft_model stays a BLS call.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import torch

from .. import names
from ..decoding.batching import Batcher
from ..records import Verdict, VerifyCall
from .adapter import ModelCallError, triton_error
from .bls import MAX_ROWS
from .dlpack import as_torch
from .engine_model import TargetModel


class HostedVerifier:
    def __init__(self, pb, model: TargetModel, name: str = names.TARGET_MODEL,
                 on_batch: Callable[[int], None] = lambda rows: None,
                 max_prefill: int | None = None):
        self.pb, self.model, self.name = pb, model, name
        self.rows = Batcher(self._verify, MAX_ROWS, max_prefill, VerifyCall.prefill.fget)
        self.on_batch = on_batch   # Metrics.target_batch

    async def verify(self, call: VerifyCall) -> Verdict:
        q = call.draft_probs
        if q is not None and not isinstance(q, torch.Tensor):   # draft_model's [1, k, V] tensor
            call = replace(call, draft_probs=as_torch(q)[0])
        return await self.rows.submit(call)

    async def _verify(self, cs: list[VerifyCall]) -> list[Verdict | ModelCallError]:
        self.on_batch(len(cs))
        try:
            results = self.model.run_calls(cs)
        finally:
            self.model.show_slots()
        return [self._error(r) if isinstance(r, Exception) else r for r in results]

    def _error(self, exc: Exception) -> ModelCallError:
        error = triton_error(self.pb, exc)   # the code a BLS caller would have read
        return ModelCallError(f"{self.name}: {error.message()}",
                              error.code() == self.pb.TritonError.UNAVAILABLE)

    async def release(self, seq_id: int) -> None:
        self.model.engine.release([seq_id])
        self.model.show_slots()
