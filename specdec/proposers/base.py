"""One sequence's proposers, on one interface the loop (loop.py) drives each round.

Each says how many tokens it can offer now (`offer`), drafts them (`propose`), learns from the
target's verdict (`observe`) and frees what it holds for the sequence (`release`). They keep the
state the loop used to thread through its rounds: how many committed tokens a draft model or a
lookup index holds, and the proposal a drafter in the target's process (in_target.py) made a
round ahead.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from ..records import Failure, Proposal, ProposeCall, Proposer, SamplingParams, Verdict

if TYPE_CHECKING:
    from .ngram import NgramProposer
    from .suffix import SuffixProposer
    from ..planning.policy import Policy


class Drafter(Protocol):
    async def propose(self, call: ProposeCall) -> Proposal: ...
    async def release(self, seq_id: int) -> None: ...


@dataclass
class Drafted:
    proposal: Proposal
    fed: int = 0                  # committed tokens the proposer caught up on to draft
    drafted: int = 0              # the head's steps over its batch (Round.drafted)
    failure: Failure | None = None
    draft_s: float | None = None  # the head's, spent inside the previous verification

    def cut(self, k: int) -> "Drafted":
        """Its first k drafts alone (a grammar's cut)."""
        p = self.proposal
        return replace(self, proposal=Proposal(p.tokens[:k], None if p.probs is None else
                                               p.probs[:k]))


class SequenceProposer:
    kind: Proposer
    holds = False        # holds state for the sequence that only its release frees
    awaited = True       # the loop waits for its release (a draft model's: only briefly)
    in_verifier = False  # its drafts come from the verifier's previous call (in_target.py)

    def offer(self, committed: list[int], limit: int) -> int:
        """The most tokens it can propose now, at most limit (> 0)."""
        return limit

    async def propose(self, committed: list[int], k: int) -> Drafted:
        raise NotImplementedError

    def observe(self, n: int, k: int, verdict: Verdict, target_fed: int) -> None:
        """A verification of the n committed tokens and the k this proposer drafted (0: it did
        not draft this round, or failed); target_fed: committed tokens the target caught up
        on."""

    def next_k(self, limit: int) -> int | None:
        """Tokens the verifier should draft now for the next round (None: it drafts none)."""
        return None

    async def release(self) -> None:
        pass


class _Cached(SequenceProposer):
    """A proposer outside the target that caches a prefix of the committed tokens."""

    def __init__(self, drafter: Drafter, seq_id: int, sampling: SamplingParams,
                 timeout_s: float | None = None):
        self.drafter, self.seq_id, self.sampling, self.timeout_s = drafter, seq_id, sampling, \
            timeout_s
        self.held = 0   # committed tokens it holds

    async def propose(self, committed: list[int], k: int) -> Drafted:
        self.holds = True
        held, fed = self.held, len(committed) - self.held
        try:
            proposal = await self._call(ProposeCall(self.seq_id, held, committed[held:], k,
                                                    self.sampling))
        except Exception as exc:   # the draft is an accelerator, never a dependency
            self.held = 0          # its cache is unknown now: re-prefill next time
            return Drafted(Proposal([], None), fed, failure=_failure_reason(exc))
        return Drafted(proposal, fed)   # a lookup may have fewer than k; 0: target only

    async def _call(self, call: ProposeCall) -> Proposal:
        return await self.drafter.propose(call)

    def observe(self, n: int, k: int, verdict: Verdict, target_fed: int) -> None:
        if k:
            self.held = n + min(verdict.num_accepted, k - 1)  # fed d_1..d_{k-1}; d_k never

    async def release(self) -> None:
        await self.drafter.release(self.seq_id)


class DraftModelProposer(_Cached):
    """The draft model; a call slower than timeout_s counts as failed."""
    kind = Proposer.DRAFT
    # One that is restarting (its slots gone with its process) would hold the sequence's
    # admission slot for seconds.
    awaited = False

    async def _call(self, call: ProposeCall) -> Proposal:
        return await asyncio.wait_for(self.drafter.propose(call), self.timeout_s)


class LookupProposer(_Cached):
    """Prompt lookup (ngram.py): its index is brought up to date by every offer."""
    kind = Proposer.NGRAM
    holds = True
    ngram: "NgramProposer"

    def __init__(self, ngram: "NgramProposer", seq_id: int, sampling: SamplingParams):
        super().__init__(ngram, seq_id, sampling)
        self.ngram = ngram

    def offer(self, committed: list[int], limit: int) -> int:
        held, self.held = self.held, len(committed)
        return self.ngram.lookup(self.seq_id, held, committed[held:]).proposes(limit)


class SuffixLookupProposer(SequenceProposer):
    """Suffix decoding (suffix.py): the sequence's own tree, and the server's of earlier
    outputs unless `own_only` (a seeded sampling request's proposals may depend on its own
    history alone)."""
    kind = Proposer.SUFFIX
    holds = True

    def __init__(self, suffix: "SuffixProposer", seq_id: int, prompt: list[int], tenant: str,
                 own_only: bool):
        self.suffix, self.seq_id, self.own_only = suffix, seq_id, own_only
        suffix.open(seq_id, prompt, tenant)
        self.pending: list[int] = []

    def offer(self, committed: list[int], limit: int) -> int:
        self.pending = self.suffix.lookup(self.seq_id, limit, self.own_only)
        return len(self.pending)

    async def propose(self, committed: list[int], k: int) -> Drafted:
        return Drafted(Proposal(self.pending[:k], None))

    def observe(self, n: int, k: int, verdict: Verdict, target_fed: int) -> None:
        self.suffix.commit(self.seq_id, verdict.tokens)

    async def release(self) -> None:
        self.suffix.finish(self.seq_id)


class InTargetProposer(SequenceProposer):
    """A drafter in the target's process (an EAGLE-3 head, Medusa heads, the target with layers
    skipped, a draft model placed there): the verification of round r drafts round r + 1. Its
    state lives in the verifier, whose release frees it."""
    in_verifier = True

    def __init__(self, kind: Proposer, policy: "Policy"):
        self.kind, self.policy = kind, policy
        self.pending: list[int] = []   # its proposal for this round
        self.pending_s = 0.0           # and the seconds it took
        self.fed = 0                   # committed tokens it or the target caught up on
        self.steps = 0                 # its steps over the batch that drafted it

    def offer(self, committed: list[int], limit: int) -> int:
        return min(len(self.pending), limit)

    def unused(self, chosen: SequenceProposer | None, k: int) -> int:
        """Its drafts for this round that the round does not verify (chosen drafts k)."""
        return len(self.pending) - (k if chosen is self else 0)

    async def propose(self, committed: list[int], k: int) -> Drafted:
        # A proposal drafted after a prefill's catch-up costs like a prefill.
        return Drafted(Proposal(self.pending[:k], None), self.fed,
                       max(self.steps, len(self.pending)), draft_s=self.pending_s)

    def observe(self, n: int, k: int, verdict: Verdict, target_fed: int) -> None:
        self.pending, self.pending_s = verdict.proposal or [], verdict.draft_s
        self.fed, self.steps = max(target_fed, verdict.fed), verdict.steps

    def next_k(self, limit: int) -> int | None:
        return self.policy.lookahead(limit)


def _failure_reason(exc: Exception) -> Failure:
    if isinstance(exc, asyncio.TimeoutError):
        return Failure.TIMEOUT
    return Failure.UNAVAILABLE if getattr(exc, "unavailable", False) else Failure.ERROR
