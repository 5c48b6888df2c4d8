"""The speculative propose/verify loop, written once against two small interfaces.

A `Drafter` proposes k tokens for a sequence; a `Verifier` scores them and returns the accepted
prefix plus one token of its own. In process they wrap an `Engine` (specdec.local); in Triton
they are BLS calls to draft_model and target_model. Per round: one draft call, one target call.

Cache bookkeeping lives here, not in the models: each call carries the cached length to roll
back to and the committed tokens the model has not seen. The target always caches all committed
tokens but the last; the draft also lags behind by whatever it never fed.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Protocol

from .engine import ProposeCall, Proposal, Verdict, VerifyCall
from .sampling import SamplingParams


class Drafter(Protocol):
    async def propose(self, call: ProposeCall) -> Proposal: ...
    async def release(self, seq_id: int) -> None: ...


class Verifier(Protocol):
    async def verify(self, call: VerifyCall) -> Verdict: ...
    async def release(self, seq_id: int) -> None: ...


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    max_tokens: int
    num_draft_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[tuple[int, ...], ...] = ()   # token sequences that end generation (not shown)
    eos: tuple[int, ...] = ()                # ids that end generation (not shown)
    # Sampled tokens depend on the round structure, so a seeded sampling request keeps its K
    # under load: its output is then a function of its inputs and seed alone.
    fixed_k: bool = False
    # The first round is the target's prefill alone, so the first token comes as soon as
    # without speculation; the draft prefills on its first proposal instead.
    prefill_alone: bool = True


@dataclass
class Stats:
    num_output_tokens: int = 0
    total_draft_tokens: int = 0
    total_accepted_draft_tokens: int = 0
    rounds: int = 0
    accepted_per_round: list[int] = field(default_factory=list)
    draft_s: float = 0.0
    verify_s: float = 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.total_accepted_draft_tokens / max(self.total_draft_tokens, 1)


@dataclass
class Chunk:
    tokens: list[int]           # output tokens now safe to show
    finish_reason: str | None   # None until the last chunk: "length", "eos", "stop", "cancelled"
    stats: Stats


class _Output:
    """Generated tokens, stop conditions, and how much of them may be shown yet."""

    def __init__(self, req: Request, max_len: int):
        self.req, self.max_len = req, max_len
        self.tokens: list[int] = []
        self.shown = 0
        self.finish: str | None = None
        # A partial stop sequence at the end may still complete: hold that many tokens back.
        self.hold = max((len(s) for s in req.stop), default=1) - 1

    def extend(self, new: list[int]) -> None:
        for t in new:
            if t in self.req.eos:
                self.finish = "eos"
                return
            self.tokens.append(t)
            for s in self.req.stop:
                if len(self.tokens) >= len(s) and tuple(self.tokens[-len(s):]) == s:
                    del self.tokens[-len(s):]
                    self.finish = "stop"
                    return
            if len(self.tokens) >= self.req.max_tokens:
                self.finish = "length"
                return
        if len(self.req.prompt) + len(self.tokens) > self.max_len:
            self.finish = "length"  # context window full

    def take(self) -> list[int]:
        end = len(self.tokens) if self.finish else max(self.shown, len(self.tokens) - self.hold)
        new, self.shown = self.tokens[self.shown:end], end
        return new


@dataclass(frozen=True)
class LoadPolicy:
    """How many draft tokens a round may use given the load: speculate when the target is
    under-used. A verification pass costs about as much as a plain step only while the batch
    is small (memory-bound); as concurrent sequences grow, K+1 tokens per sequence start to
    cost K+1 times more, and speculation loses. Full K up to `full_below` active sequences,
    then linearly less, none from `off_at` on."""
    full_below: int = 8
    off_at: int = 32

    def limit(self, k: int, active: int) -> int:
        if active < self.full_below:
            return k
        if active >= self.off_at:
            return 0
        return int(k * (self.off_at - active) / (self.off_at - self.full_below + 1))


@dataclass(frozen=True)
class Round:
    k: int            # tokens drafted
    accepted: int     # of those, accepted
    draft_s: float
    verify_s: float


async def speculate(seq_id: int, req: Request, drafter: Drafter, verifier: Verifier,
                    max_len: int, emit: Callable[[Chunk], Awaitable[None] | None],
                    cancelled: Callable[[], bool] = lambda: False,
                    on_round: Callable[[Round], None] | None = None,
                    allowed_k: Callable[[int], int] = lambda k: k) -> Stats:
    """Generate for one sequence, calling `emit` with each chunk; always releases both models.

    max_len: the KV slot length of both models; the committed sequence never outgrows it.
    on_round: observes every round (metrics).
    allowed_k: the draft tokens a round may use now, given the request's (load policy).
    """
    stats, out = Stats(), _Output(req, max_len)
    committed = list(req.prompt)
    target_len = draft_len = 0        # tokens each model has cached, all committed
    drafted = False
    try:
        while out.finish is None:
            if cancelled():
                out.finish = "cancelled"
                break
            n = len(committed)
            k = 0 if req.prefill_alone and stats.rounds == 0 else max(0, min(
                allowed_k(req.num_draft_tokens), max_len - n, req.max_tokens - len(out.tokens) - 1))
            proposal = Proposal([], None)
            t0 = time.perf_counter()
            if k > 0:
                drafted = True
                proposal = await drafter.propose(ProposeCall(
                    seq_id, draft_len, committed[draft_len:], k, req.sampling))
            t1 = time.perf_counter()
            verdict = await verifier.verify(VerifyCall(
                seq_id, target_len, committed[target_len:], proposal.tokens, proposal.probs,
                req.sampling))
            t2 = time.perf_counter()
            m = verdict.num_accepted
            committed += verdict.tokens
            target_len = n + m
            if k > 0:
                draft_len = n + min(m, k - 1)  # it fed d_1..d_{k-1}; d_k and later never
            stats.rounds += 1
            stats.total_draft_tokens += k
            stats.total_accepted_draft_tokens += m
            stats.accepted_per_round.append(m)
            stats.draft_s += t1 - t0
            stats.verify_s += t2 - t1
            if on_round is not None:
                on_round(Round(k, m, t1 - t0, t2 - t1))
            out.extend(verdict.tokens)
            stats.num_output_tokens = len(out.tokens)
            new = out.take()
            if new or out.finish:
                await _call(emit, Chunk(new, out.finish, stats))
        if out.finish == "cancelled":
            await _call(emit, Chunk(out.take(), out.finish, stats))
        return stats
    finally:
        releases = [verifier.release(seq_id)] + ([drafter.release(seq_id)] if drafted else [])
        await asyncio.shield(asyncio.gather(*releases, return_exceptions=True))


async def _call(fn, chunk: Chunk) -> None:
    result = fn(chunk)
    if asyncio.iscoroutine(result):
        await result
