"""The speculative propose/verify loop, written once against two small interfaces.

A `Drafter` proposes k tokens for a sequence; a `Verifier` scores them and returns the accepted
prefix plus one token of its own. In process they wrap an `Engine` (specdec.decoding.local); in
Triton they are BLS calls to draft_model and target_model. Per round: one draft call, one target
call. A request may draft with the draft model, with prompt lookup (ngram.py, in this process, no
call), with a drafter in the target's process (in_target.py: an EAGLE-3 head, Medusa heads, the
target with layers skipped, or the draft model placed there; the verification of round r returns
round r + 1's proposal, so a round is one call), or with several, chosen per round (hybrid).

Each round reads: the proposers the sequence has (proposers/base.py) offer, the policy chooses k and
one of them, it proposes, the target verifies, the verdict is committed and every proposer
observes it, the shown tokens are emitted.

Cache bookkeeping lives here and in the proposers, not in the models: each call carries the
cached length to roll back to and the committed tokens the model has not seen. The target always
caches all committed tokens but the last; a draft also lags behind by whatever it never fed.
"""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable, Protocol

from ..planning.planner import Planner
from ..planning.policy import Choice, Policy
from ..proposers.base import (DraftModelProposer, Drafted, Drafter, InTargetProposer,
                              LookupProposer, SequenceProposer, SuffixLookupProposer)
from ..proposers.ngram import NgramProposer
from ..proposers.suffix import SuffixProposer
from ..records import (DRAFTING, IN_TARGET, Chunk, Finish, Proposal, Proposer, Request, Round,
                       Stats, TokenLogprob, Verdict, VerifyCall)


class Constraint(Protocol):
    """A request's grammar (grammar.Constraint)."""
    def masks(self, drafts: list[int]) -> tuple[int, object]: ...   # (drafts to keep, masks)
    def commit(self, tokens: list[int]) -> None: ...


class Verifier(Protocol):
    async def verify(self, call: VerifyCall) -> Verdict: ...
    async def release(self, seq_id: int) -> None: ...


NOTHING = Drafted(Proposal([], None))   # a round that drafts nothing
# How long a finished sequence waits for the draft model's release before it frees its slot
# (a healthy draft answers in milliseconds; the release goes on after that, unwaited).
DRAFT_RELEASE_WAIT_S = 0.05
# What a request's proposer may draft with, in the order a fixed k prefers them. Hybrid drafts
# with what the server has, of the drafters in the target's process only the first
# (planner.in_target_of); suffix decoding last: it offers on any match, however weak, and at a
# fixed k would take every round from the model drafters (auto weighs it by what it accepts).
PROPOSER_SETS = {**{p: (p,) for p in DRAFTING},
                 Proposer.HYBRID: (Proposer.NGRAM, Proposer.EAGLE, Proposer.MEDUSA,
                                   Proposer.DRAFT, Proposer.SELF, Proposer.SUFFIX)}


def open_policy(planner: Planner, req: Request) -> Policy:
    """The request's policy on a server-wide planner; close it with planner.close."""
    return planner.open(req.num_draft_tokens, req.auto, req.reproducible,
                        PROPOSER_SETS[req.proposer])


class _Output:
    """Generated tokens, stop conditions, and how much of them may be shown yet."""

    def __init__(self, req: Request, max_len: int):
        self.req, self.max_len = req, max_len
        self.tokens: list[int] = []
        self.logprobs: list[TokenLogprob] | None = [] if req.logprobs is not None else None
        self.shown = 0
        self.finish: Finish | None = None
        # A partial stop sequence at the end may still complete: hold that many tokens back.
        self.hold = max((len(s) for s in req.stop), default=1) - 1

    def extend(self, new: list[int], logprobs: list[TokenLogprob] | None = None) -> None:
        if self.req.max_tokens == 0:   # the prompt scored, nothing generated
            self.finish = Finish.LENGTH
            return
        for i, t in enumerate(new):
            if t in self.req.eos:
                self.finish = Finish.EOS
                return
            self.tokens.append(t)
            if self.logprobs is not None:
                self.logprobs.append(logprobs[i])
            for s in self.req.stop:
                if len(self.tokens) >= len(s) and tuple(self.tokens[-len(s):]) == s:
                    del self.tokens[-len(s):]
                    if self.logprobs is not None:
                        del self.logprobs[-len(s):]
                    self.finish = Finish.STOP
                    return
            if len(self.tokens) >= self.req.max_tokens:
                self.finish = Finish.LENGTH
                return
        if len(self.req.prompt) + len(self.tokens) > self.max_len:
            self.finish = Finish.LENGTH  # context window full

    def take(self) -> tuple[list[int], list[TokenLogprob] | None]:
        """The tokens that may be shown now, and their logprobs when the request asked."""
        end = len(self.tokens) if self.finish else max(self.shown, len(self.tokens) - self.hold)
        new, start, self.shown = self.tokens[self.shown:end], self.shown, end
        return new, None if self.logprobs is None else self.logprobs[start:end]


async def speculate(seq_id: int, req: Request, drafter: Drafter, verifier: Verifier,
                    max_len: int, emit: Callable[[Chunk], Awaitable[None] | None],
                    cancelled: Callable[[], bool] = lambda: False,
                    on_round: Callable[[Round], None] | None = None,
                    policy: Policy | None = None, draft_timeout_s: float | None = None,
                    ngram: NgramProposer | None = None,
                    in_target: tuple[Proposer, ...] = (),
                    constraint: Constraint | None = None,
                    suffix: SuffixProposer | None = None) -> Stats:
    """Generate for one sequence, calling `emit` with each chunk; always releases both models.

    drafter: the draft model in a process of its own (None: none there); ngram: prompt lookup,
    for requests whose proposer is "ngram" or "hybrid"; in_target: the proposers the verifier
    drafts with in its own process (in_target.py), a draft model placed there among them.
    max_len: the KV slot length of both models; the committed sequence never outgrows it.
    on_round: observes every round (metrics).
    policy: chooses each round's k and proposer (policy.py) among those the sequence has;
    default: exactly num_draft_tokens.
    draft_timeout_s: a draft call that takes longer counts as failed. A failed draft call never
    fails the request: the round goes on target-only and the draft re-prefills when next used.
    constraint: the request's grammar (grammar.py): its masks go with every verification, and a
    draft it forbids ends the proposal there. suffix: suffix decoding's trees (suffix.py), for
    requests whose proposer is "suffix" or "hybrid".
    """
    allowed = _allowed(req, policy, drafter, ngram, in_target, suffix)
    if policy is None:
        policy = Planner(req.num_draft_tokens, in_target=IN_TARGET + in_target).open(
            req.num_draft_tokens, False, proposers=allowed)
    # Only those the server has: a hybrid policy names every proposer hybrid may use.
    proposers = _proposers([p for p in policy.proposers if p in allowed], seq_id, req, policy,
                           drafter, ngram, draft_timeout_s, suffix)
    # A request that drafts nothing (num_draft_tokens 0) asks no drafter in the target for its
    # next proposal: the head's or co-located draft's catch-up each round would be thrown away.
    ahead = policy.ahead if policy.ahead in proposers and req.num_draft_tokens else None
    stats, out = Stats(), _Output(req, max_len)
    committed = list(req.prompt)
    target_len = 0                    # tokens the target has cached, all committed
    verified_at = None
    prompt_logprobs = None            # the first verification's, until a chunk carries them
    try:
        while out.finish is None:
            if cancelled():
                out.finish = Finish.CANCELLED
                break
            n, t0 = len(committed), time.perf_counter()
            # Choose: k and who drafts it, within what the request has left.
            first = req.prefill_alone and stats.rounds == 0
            limit = 0 if first else _room(req, max_len, n, len(out.tokens))
            choice = policy.choose(limit, {p: q.offer(committed, limit)
                                           for p, q in proposers.items()}) if limit else Choice(0)
            chosen = proposers.get(choice.proposer) if choice.k else None
            # Propose.
            d = await chosen.propose(committed, choice.k) if chosen else NOTHING
            masks = None
            if constraint is not None:
                # The first draft the grammar forbids stays, the last: the target rejects it
                # (its masked probability is 0) and draws from the residual, as for any
                # rejection, which keeps sampling exact; the drafts after it go.
                keep, masks = constraint.masks(d.proposal.tokens)
                d = d.cut(keep) if keep < len(d.proposal.tokens) else d
            k, t1 = len(d.proposal.tokens), time.perf_counter()
            discarded = proposers[ahead].unused(chosen, k) if ahead else 0
            ahead_s = (proposers[ahead].pending_s if discarded and chosen is not proposers[ahead]
                       else None)
            # Verify; an in-target drafter drafts the next round's proposal inside this call,
            # for a round with at least one more token committed.
            next_k = (proposers[ahead].next_k(_room(req, max_len, n + 1, len(out.tokens) + 1))
                      if ahead else None)
            verdict = await verifier.verify(VerifyCall(
                seq_id=seq_id, start=target_len, tokens=committed[target_len:],
                drafts=d.proposal.tokens, draft_probs=d.proposal.probs, sampling=req.sampling,
                next_k=next_k, drafts_in_target=bool(k and chosen.in_verifier), next_by=ahead,
                logprobs=req.logprobs,
                prompt_logprobs=req.prompt_logprobs if target_len == 0 else None, masks=masks))
            t2 = time.perf_counter()
            # Commit: every proposer sees the verdict, the policy and the metrics the round.
            for q in proposers.values():
                q.observe(n, k if q is chosen else 0, verdict, n - target_len)
            committed += verdict.tokens
            if constraint is not None:
                constraint.commit(verdict.tokens)
            # The verification's time less the in-target drafter's next proposal (not this
            # round's); a head's draft time is that of the verification before.
            r = Round(k=k, accepted=verdict.num_accepted,
                      draft_s=t1 - t0 if d.draft_s is None else d.draft_s,
                      verify_s=t2 - t1 - verdict.draft_s,
                      other_s=None if verified_at is None else t0 - verified_at,
                      prefill=n - target_len > 2, draft_fed=d.fed, failure=d.failure,
                      limit=limit, reason=choice.reason, proposer=choice.proposer,
                      drafted=d.drafted, in_target_failure=verdict.failure,
                      batch_k=max(verdict.batch_k, k), discarded=discarded, ahead=ahead,
                      ahead_s=ahead_s)
            target_len, verified_at = n + r.accepted, t2
            _count(stats, r)
            policy.observe(r)
            if on_round is not None:
                on_round(r)
            # Emit what may be shown.
            out.extend(verdict.tokens, verdict.logprobs)
            stats.num_output_tokens = len(out.tokens)
            if verdict.prompt_logprobs is not None:
                prompt_logprobs = verdict.prompt_logprobs
            new, logprobs = out.take()
            if new or out.finish:
                await _call(emit, Chunk(new, out.finish, stats, logprobs, prompt_logprobs))
                prompt_logprobs = None
        if out.finish == Finish.CANCELLED:
            new, logprobs = out.take()
            await _call(emit, Chunk(new, out.finish, stats, logprobs, prompt_logprobs))
        return stats
    finally:
        # The verifier's release (the target's slot, the head's state) is awaited: the next
        # sequence admitted needs that slot. A draft model's only briefly: one that is restarting
        # (its slots gone with its process) would hold this sequence's admission slot for
        # seconds. A model takes calls in order, and a batch's releases before its proposals, so
        # a later sequence's first proposal still finds this one's draft slot free.
        holding = [q for q in proposers.values() if q.holds]
        later = [asyncio.ensure_future(q.release()) for q in holding if not q.awaited]
        for task in later:
            task.add_done_callback(_retrieve)
        await asyncio.shield(asyncio.gather(
            verifier.release(seq_id), *(q.release() for q in holding if q.awaited),
            return_exceptions=True))
        if later:
            await asyncio.wait(later, timeout=DRAFT_RELEASE_WAIT_S)


def _room(req: Request, max_len: int, n: int, produced: int) -> int:
    """The most a round may draft with n tokens committed, `produced` of them output: room for
    the drafts and the target's own token in the slot (max_len) and in max_tokens."""
    return max(0, min(req.num_draft_tokens, max_len - n, req.max_tokens - produced - 1))


def _allowed(req: Request, policy: Policy | None, drafter, ngram,
             in_target: tuple[Proposer, ...], suffix=None) -> tuple[Proposer, ...]:
    """What the request may draft with: hybrid with what is configured, any other only with
    its own proposer (an error when that is not configured)."""
    has = {p: p in in_target for p in DRAFTING}
    has[Proposer.DRAFT] = drafter is not None or Proposer.DRAFT in in_target
    has[Proposer.NGRAM] = ngram is not None
    has[Proposer.SUFFIX] = suffix is not None
    allowed = policy.proposers if policy is not None else PROPOSER_SETS[req.proposer]
    if req.proposer == Proposer.HYBRID:
        allowed = tuple(p for p in allowed if has[p])
    missing = [p for p in allowed if not has[p]]
    if missing:
        raise ValueError(f"proposer '{req.proposer}' needs {', '.join(missing)}, not configured")
    return allowed


def _proposers(allowed, seq_id: int, req: Request, policy: Policy, drafter, ngram,
               draft_timeout_s: float | None, suffix=None) -> dict[Proposer, SequenceProposer]:
    def make(p: Proposer) -> SequenceProposer:
        if p == Proposer.NGRAM:
            return LookupProposer(ngram, seq_id, req.sampling)
        if p == Proposer.SUFFIX:
            return SuffixLookupProposer(suffix, seq_id, req.prompt, req.tenant, req.reproducible)
        if p == Proposer.DRAFT and drafter is not None:
            return DraftModelProposer(drafter, seq_id, req.sampling, draft_timeout_s)
        return InTargetProposer(p, policy)
    return {p: make(p) for p in allowed}


def _count(stats: Stats, r: Round) -> None:
    stats.rounds += 1
    stats.total_draft_tokens += r.k
    stats.total_accepted_draft_tokens += r.accepted
    if r.proposer == Proposer.NGRAM:
        stats.ngram_draft_tokens += r.k
        stats.ngram_accepted_tokens += r.accepted
    stats.accepted_per_round.append(r.accepted)
    stats.draft_s += r.draft_s
    stats.verify_s += r.verify_s


def _retrieve(task: asyncio.Future) -> None:
    """A release left running has no one to raise to: its error is the draft's to log."""
    if not task.cancelled():
        task.exception()


async def _call(fn, chunk: Chunk) -> None:
    result = fn(chunk)
    if asyncio.iscoroutine(result):
        await result
