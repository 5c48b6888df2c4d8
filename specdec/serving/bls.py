"""Drafter and Verifier over Triton BLS: draft_model's calls one by one, target_model's a
round's at a time (batching.py: the verifications of every sequence under way, one request)."""
from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from .. import names
from ..decoding.batching import Batcher
from ..records import Proposal, ProposeCall, Verdict, VerifyCall
from . import calls
from .adapter import ModelCallError
from ..serving.recovery import is_down


class _Model:
    def __init__(self, pb, model_name: str):
        self.pb, self.name = pb, model_name

    async def call(self, inputs: dict[str, np.ndarray], outputs: list[str], extra=()):
        pb = self.pb
        tensors = [pb.Tensor(n, v) for n, v in inputs.items()] + list(extra)
        request = pb.InferenceRequest(model_name=self.name, inputs=tensors,
                                      requested_output_names=outputs)
        response = await request.async_exec()
        if response.has_error():
            err = response.error()
            # A BLS answer's error code is always INTERNAL (Triton 2.51's Python backend keeps the
            # message only): a full model says so in the message (adapter.triton_error); a model
            # that is down (its process died, or it restarts) is retryable too.
            message = err.message()
            unavailable = names.UNAVAILABLE in message or is_down(message)
            raise ModelCallError(f"{self.name}: {message}", unavailable)
        return response

    def output(self, response, name: str) -> np.ndarray:
        return self.pb.get_output_tensor_by_name(response, name).as_numpy()

    async def release(self, seq_id: int) -> None:
        await self.call(calls.release_inputs(seq_id), [])


def ping(pb, model_name: str) -> str | None:
    """A blocking no-op call (the release of a sequence that is not open): None when the model
    answered, else its error. For the supervisor's thread, outside the event loop."""
    tensors = [pb.Tensor(n, v) for n, v in calls.release_inputs(0).items()]
    response = pb.InferenceRequest(model_name=model_name, inputs=tensors,
                                   requested_output_names=[]).exec()
    return response.error().message() if response.has_error() else None


class CancelForwarder:
    """postprocessing's side of an ensemble client's cancellation (orchestrator.py): the first
    cancelled step request of a generation sends the orchestrator `cancel_generation`, once.
    Blocking, from postprocessing's execute; a failure leaves the generation to run to its end,
    as it would without this.

    request.is_cancelled() is a round trip to the server process, asked of a generation at most
    every `every_s` (its first response asks at once). Every response of every stream passes
    through postprocessing's one instance in turn: at 16 streams at the H200's step times,
    asked of each response, a response waited 1.65-1.99 ms for it and took 0.56 ms in it;
    asked every 0.1 s, 0.48-1.02 and 0.40-0.46 (docs/benchmarks.md, "A request's start at 16
    streams, and postprocessing's queue")."""

    def __init__(self, pb, model_name: str = names.ORCHESTRATOR, remember: int = 4096,
                 every_s: float = 0.1, clock: Callable[[], float] = time.monotonic):
        self.pb, self.name, self.remember = pb, model_name, remember
        self.every_s, self.clock = every_s, clock
        self.sent: dict[int, None] = {}    # ids already cancelled, oldest first
        self.asked: dict[int, float] = {}  # id -> when is_cancelled() was last asked, oldest first

    def check(self, request, generation_id: int | None, final: bool = False) -> bool:
        """True when this call sent a cancellation. final: the generation's last response (it
        has ended: nothing to cancel, nothing to remember)."""
        if generation_id is None or generation_id in self.sent:
            return False
        if final:
            self.asked.pop(generation_id, None)
            return False
        now = self.clock()
        if now - self.asked.get(generation_id, -math.inf) < self.every_s:
            return False
        self.asked.pop(generation_id, None)   # re-inserted last: the oldest go first
        self.asked[generation_id] = now
        _forget_oldest(self.asked, self.remember)
        if not request.is_cancelled():
            return False
        del self.asked[generation_id]
        self.sent[generation_id] = None
        _forget_oldest(self.sent, self.remember)
        pb = self.pb
        tensors = [pb.Tensor(names.INPUT_IDS, np.zeros(0, np.int32)),
                   pb.Tensor(names.CANCEL_GENERATION, np.array([generation_id], np.uint64))]
        try:
            for _ in pb.InferenceRequest(model_name=self.name, inputs=tensors,
                                         requested_output_names=[]).exec(decoupled=True):
                pass
        except Exception:
            return False
        return True


def _forget_oldest(ids: dict, keep: int) -> None:
    while len(ids) > keep:
        del ids[next(iter(ids))]


class BlsDrafter(_Model):
    def __init__(self, pb, model_name: str = names.DRAFT_MODEL):
        super().__init__(pb, model_name)

    async def propose(self, call: ProposeCall) -> Proposal:
        greedy = call.sampling.greedy
        outputs = [names.DRAFT_TOKENS] + ([] if greedy else [names.DRAFT_PROBS])
        response = await self.call(calls.propose_inputs(call), outputs)
        tokens = self.output(response, names.DRAFT_TOKENS).reshape(-1).tolist()
        # The probabilities stay a Triton tensor (on the draft's device) until the target reads them.
        probs = None if greedy else self.pb.get_output_tensor_by_name(response, names.DRAFT_PROBS)
        return Proposal(tokens, probs)


# target_model's max_batch_size (its config.pbtxt): the most rows a request may carry.
MAX_ROWS = 64


class BlsVerifier(_Model):
    def __init__(self, pb, model_name: str = names.TARGET_MODEL,
                 on_batch: Callable[[int], None] = lambda rows: None,
                 max_prefill: int | None = None):
        super().__init__(pb, model_name)
        self.rows = Batcher(self._verify, MAX_ROWS, max_prefill, VerifyCall.prefill.fget)
        self.on_batch = on_batch   # Metrics.target_batch

    async def verify(self, call: VerifyCall) -> Verdict:
        if call.draft_probs is None:
            return await self.rows.submit(call)
        [verdict] = await self._verify([call])   # q is the draft's own tensor: one row
        if isinstance(verdict, Exception):
            raise verdict
        return verdict

    async def _verify(self, cs: list[VerifyCall]) -> list[Verdict | ModelCallError]:
        self.on_batch(len(cs))
        extra = [] if cs[0].draft_probs is None else [cs[0].draft_probs]
        response = await self.call(calls.verify_inputs(cs), [names.VERDICT], extra)
        return [ModelCallError(f"{self.name}: {v}", v.unavailable) if isinstance(v, Exception)
                else v for v in calls.verdicts(self.output(response, names.VERDICT))]
