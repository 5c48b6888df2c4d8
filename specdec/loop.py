"""The speculative propose/verify loop, written once against two small interfaces.

A `Drafter` proposes k tokens for a sequence; a `Verifier` scores them and returns the accepted
prefix plus one token of its own. In process they wrap an `Engine` (specdec.local); in Triton
they are BLS calls to draft_model and target_model. Per round: one draft call, one target call.
A request may draft with the draft model, with prompt lookup (ngram.py, in this process, no
call), with an EAGLE-3 head in the target (eagle/: the verification of round r returns round
r + 1's proposal, so a round is one call), or with any of them, chosen per round (hybrid).

Cache bookkeeping lives here, not in the models: each call carries the cached length to roll
back to and the committed tokens the model has not seen. The target always caches all committed
tokens but the last; the draft also lags behind by whatever it never fed.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Protocol

from .ngram import NgramProposer
from .policy import Choice, Planner, Policy
from .records import (DRAFTING, Chunk, Failure, Finish, Proposal, ProposeCall, Proposer, Request,
                      Round, Stats, Verdict, VerifyCall)


class Drafter(Protocol):
    async def propose(self, call: ProposeCall) -> Proposal: ...
    async def release(self, seq_id: int) -> None: ...


class Verifier(Protocol):
    async def verify(self, call: VerifyCall) -> Verdict: ...
    async def release(self, seq_id: int) -> None: ...


# How long a finished sequence waits for the draft model's release before it frees its slot
# (a healthy draft answers in milliseconds; the release goes on after that, unwaited).
DRAFT_RELEASE_WAIT_S = 0.05
# What a request's proposer may draft with, in the order a fixed k prefers them. Hybrid drafts
# with what the server has.
PROPOSER_SETS = {**{p: (p,) for p in DRAFTING},
                 Proposer.HYBRID: (Proposer.NGRAM, Proposer.EAGLE, Proposer.DRAFT)}


def open_policy(planner: Planner, req: Request) -> Policy:
    """The request's policy on a server-wide planner; close it with planner.close."""
    return planner.open(req.num_draft_tokens, req.auto, req.reproducible,
                        PROPOSER_SETS[req.proposer])


class _Output:
    """Generated tokens, stop conditions, and how much of them may be shown yet."""

    def __init__(self, req: Request, max_len: int):
        self.req, self.max_len = req, max_len
        self.tokens: list[int] = []
        self.shown = 0
        self.finish: Finish | None = None
        # A partial stop sequence at the end may still complete: hold that many tokens back.
        self.hold = max((len(s) for s in req.stop), default=1) - 1

    def extend(self, new: list[int]) -> None:
        for t in new:
            if t in self.req.eos:
                self.finish = Finish.EOS
                return
            self.tokens.append(t)
            for s in self.req.stop:
                if len(self.tokens) >= len(s) and tuple(self.tokens[-len(s):]) == s:
                    del self.tokens[-len(s):]
                    self.finish = Finish.STOP
                    return
            if len(self.tokens) >= self.req.max_tokens:
                self.finish = Finish.LENGTH
                return
        if len(self.req.prompt) + len(self.tokens) > self.max_len:
            self.finish = Finish.LENGTH  # context window full

    def take(self) -> list[int]:
        end = len(self.tokens) if self.finish else max(self.shown, len(self.tokens) - self.hold)
        new, self.shown = self.tokens[self.shown:end], end
        return new


async def speculate(seq_id: int, req: Request, drafter: Drafter, verifier: Verifier,
                    max_len: int, emit: Callable[[Chunk], Awaitable[None] | None],
                    cancelled: Callable[[], bool] = lambda: False,
                    on_round: Callable[[Round], None] | None = None,
                    policy: Policy | None = None, draft_timeout_s: float | None = None,
                    ngram: NgramProposer | None = None, head: bool = False) -> Stats:
    """Generate for one sequence, calling `emit` with each chunk; always releases both models.

    drafter: the draft model (None: none configured); ngram: prompt lookup, for requests whose
    proposer is "ngram" or "hybrid"; head: the verifier drafts with an EAGLE-3 head.
    max_len: the KV slot length of both models; the committed sequence never outgrows it.
    on_round: observes every round (metrics).
    policy: chooses each round's k and proposer (policy.py); default: exactly num_draft_tokens.
    draft_timeout_s: a draft call that takes longer counts as failed. A failed draft call never
    fails the request: the round goes on target-only and the draft re-prefills when next used.
    """
    # The head drafts inside the verifier's calls, whose release frees its state too.
    drafters = {Proposer.DRAFT: drafter, Proposer.NGRAM: ngram,
                Proposer.EAGLE: verifier if head else None}
    allowed = policy.proposers if policy is not None else PROPOSER_SETS[req.proposer]
    if req.proposer == Proposer.HYBRID:
        allowed = tuple(p for p in allowed if drafters[p] is not None)
    missing = [p for p in allowed if drafters[p] is None]
    if missing:
        raise ValueError(f"proposer '{req.proposer}' needs {', '.join(missing)}, not configured")
    if policy is None:
        policy = Planner(req.num_draft_tokens).open(req.num_draft_tokens, False,
                                                    proposers=allowed)
    policy.proposers = allowed
    stats, out = Stats(), _Output(req, max_len)
    committed = list(req.prompt)
    target_len = 0                    # tokens the target has cached, all committed
    lens = {p: 0 for p in allowed}    # tokens each proposer holds, all committed
    used = {Proposer.NGRAM} & set(allowed)   # proposers holding state for this sequence
    verified_at = None
    pending, pending_s = [], 0.0      # the head's proposal for this round, and its seconds
    pending_fed = 0                   # committed tokens its verification caught the head up on
    pending_steps = 0                 # the head's steps over the batch that drafted it
    try:
        while out.finish is None:
            if cancelled():
                out.finish = Finish.CANCELLED
                break
            n = len(committed)
            t0 = time.perf_counter()
            limit = 0 if req.prefill_alone and stats.rounds == 0 else max(0, min(
                req.num_draft_tokens, max_len - n, req.max_tokens - len(out.tokens) - 1))
            offers = {}
            if limit and Proposer.NGRAM in allowed:   # what a lookup would propose, for the choice
                held = lens[Proposer.NGRAM]
                match = ngram.lookup(seq_id, held, committed[held:])
                lens[Proposer.NGRAM], offers[Proposer.NGRAM] = n, match.proposes(limit)
            if limit and Proposer.EAGLE in allowed:
                offers[Proposer.EAGLE] = min(len(pending), limit)
            choice = policy.choose(limit, offers) if limit else Choice(0)
            k, p, failure, fed, drafted = choice.k, choice.proposer, None, 0, 0
            proposal = Proposal([], None)
            from_head = k > 0 and p == Proposer.EAGLE
            if from_head:
                proposal, drafted = Proposal(pending[:k], None), max(pending_steps, len(pending))
            elif k > 0:
                used.add(p)
                fed = n - lens[p]
                try:
                    proposal = await asyncio.wait_for(drafters[p].propose(ProposeCall(
                        seq_id, lens[p], committed[lens[p]:], k, req.sampling)),
                        draft_timeout_s if p == Proposer.DRAFT else None)
                    k = len(proposal.tokens)  # a lookup may have fewer; 0: target only
                except Exception as exc:   # the draft is an accelerator, never a dependency
                    failure = _failure_reason(exc)
                    k, lens[p] = 0, 0      # its cache is unknown now: re-prefill next time
            t1 = time.perf_counter()
            next_k = None
            if Proposer.EAGLE in allowed:   # the next round's limit is at most this
                next_k = policy.lookahead(max(0, min(req.num_draft_tokens, max_len - n - 1,
                                                     req.max_tokens - len(out.tokens) - 2)))
            verdict = await verifier.verify(VerifyCall(
                seq_id, target_len, committed[target_len:], proposal.tokens, proposal.probs,
                req.sampling, next_k, from_head))
            t2 = time.perf_counter()
            draft_s = pending_s if from_head else t1 - t0
            verify_s = t2 - t1 - verdict.draft_s   # the head's next proposal is not this round's
            if from_head:   # a proposal drafted after a prefill's catch-up costs like a prefill
                fed = pending_fed
            pending, pending_s = verdict.proposal or [], verdict.draft_s
            pending_fed, pending_steps = n - target_len, verdict.head_steps
            m = verdict.num_accepted
            prefill = n - target_len > 2
            committed += verdict.tokens
            target_len = n + m
            if k > 0 and not from_head:
                lens[p] = n + min(m, k - 1)  # it fed d_1..d_{k-1}; d_k and later never
            stats.rounds += 1
            stats.total_draft_tokens += k
            stats.total_accepted_draft_tokens += m
            if p == Proposer.NGRAM:
                stats.ngram_draft_tokens += k
                stats.ngram_accepted_tokens += m
            stats.accepted_per_round.append(m)
            stats.draft_s += draft_s
            stats.verify_s += verify_s
            r = Round(k, m, draft_s, verify_s, None if verified_at is None else t0 - verified_at,
                      prefill, fed, failure, limit, choice.reason, p, drafted, verdict.failure,
                      max(verdict.batch_k, k))
            verified_at = t2
            policy.observe(r)
            if on_round is not None:
                on_round(r)
            out.extend(verdict.tokens)
            stats.num_output_tokens = len(out.tokens)
            new = out.take()
            if new or out.finish:
                await _call(emit, Chunk(new, out.finish, stats))
        if out.finish == Finish.CANCELLED:
            await _call(emit, Chunk(out.take(), out.finish, stats))
        return stats
    finally:
        # The verifier's release (the target's slot, the head's state) is awaited: the next
        # sequence admitted needs that slot. A draft model's only briefly: one that is restarting
        # (its slots gone with its process) would hold this sequence's admission slot for
        # seconds. A model takes calls in order, and a batch's releases before its proposals, so
        # a later sequence's first proposal still finds this one's draft slot free.
        later = [asyncio.ensure_future(drafter.release(seq_id))] if Proposer.DRAFT in used else []
        for task in later:
            task.add_done_callback(_retrieve)
        await asyncio.shield(asyncio.gather(
            verifier.release(seq_id),
            *(drafters[p].release(seq_id) for p in used if p != Proposer.DRAFT),
            return_exceptions=True))
        if later:
            await asyncio.wait(later, timeout=DRAFT_RELEASE_WAIT_S)


def _retrieve(task: asyncio.Future) -> None:
    """A release left running has no one to raise to: its error is the draft's to log."""
    if not task.cancelled():
        task.exception()


def _failure_reason(exc: Exception) -> Failure:
    if isinstance(exc, asyncio.TimeoutError):
        return Failure.TIMEOUT
    return Failure.UNAVAILABLE if getattr(exc, "unavailable", False) else Failure.ERROR


async def _call(fn, chunk: Chunk) -> None:
    result = fn(chunk)
    if asyncio.iscoroutine(result):
        await result
