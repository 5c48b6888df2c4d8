"""What every sequence's policy (policy.py) shares, server-wide: the acceptance all sequences
have seen per proposer, the round costs fitted per load level (active sequences), the draft
model's health (a failed draft is off for every sequence for a backoff, then probed by one
sequence at a time) and an operator's load cap. `Planner.open` gives each request its policy.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from .estimates import (PRIOR, PRIOR_ACCEPTANCE, PRIOR_WEIGHT, Acceptance, Costs, PriorCosts,
                        argmax, rates)
from .policy import Adaptive, Fixed, Policy
from ..records import DRAFTING, IN_TARGET, Proposer, Round

# Load levels (active sequences) with separate cost fits: 1, 2, 3-4, 5-8, ..., 65+.
_LEVELS = 8
# At load the batch's width (Planner.width) moves to another k only where that k's expected
# tokens a second beat the width's by this much: where E(k)/T(k) is flat, estimates that wander
# moved it every batch, and rows that read it apart split one batch between two widths.
WIDTH_MARGIN = 0.03

def _level(active: int) -> int:
    return min(max(active - 1, 0).bit_length(), _LEVELS - 1)


@dataclass(frozen=True)
class Estimates:
    acceptance: dict[Proposer, list[float]]   # server-wide, per proposer and position
    costs: dict[str, float]                   # seconds: draft_call, draft_token, verify_call, ...


class Planner:
    """Server-wide: acceptance seen by all sequences, costs per load level, the draft's health.

    max_k: the largest k any request may use. load_cap: optional operator cap (full_below,
    off_at) on k by active sequences, as the earlier fixed load policy did; frozen (seeded
    sampling) requests are exempt, their k must not depend on load.
    """

    def __init__(self, max_k: int, load_cap: tuple[int, int] | None = None,
                 prior: PriorCosts = PRIOR, probe_every: int = 4, probe_max: int = 64,
                 down_s: float = 0.5, down_max_s: float = 10.0, clock=time.monotonic,
                 proposers: tuple[Proposer, ...] = DRAFTING,
                 in_target: tuple[Proposer, ...] = IN_TARGET):
        """proposers: what this server has; a request's set is cut down to them. in_target:
        those that draft inside the target's verification, a round ahead (in_target.py)."""
        self.max_k, self.load_cap, self.prior = max_k, load_cap, prior
        self.proposers, self.in_target = proposers, frozenset(in_target)
        self.probe_every, self.probe_max = probe_every, probe_max
        self.down_s, self.down_max_s, self.clock = down_s, down_max_s, clock
        self.acceptance = {p: Acceptance(max_k, decay=0.995) for p in DRAFTING}
        self.rounds_seen = 0
        self.widths: dict[Proposer, tuple[int, int]] = {}   # p -> (width, rounds_seen then)
        # Seconds a probe's proposal took (a moving average per proposer): an off drafter's
        # cache follows nothing, so its probe first catches up on every token since it was last
        # used (SWIFT re-reads them through its kept layers).
        self.probe_s = {p: 0.0 for p in DRAFTING}
        self.costs = [Costs.prior(prior, self.in_target) for _ in range(_LEVELS)]
        self.frozen_costs = Costs.prior(prior, self.in_target)
        self.active = 0
        # The draft's health: after a failure it is off for every sequence until `down_until`,
        # then one sequence at a time probes it; the backoff doubles while probes fail.
        self.failing = False
        self.down_until = 0.0
        self.backoff = down_s
        self.prober: Policy | None = None   # the one sequence testing a draft that failed

    def open(self, num_draft_tokens: int, auto: bool, frozen: bool = False,
             proposers: tuple[Proposer, ...] = (Proposer.DRAFT,)) -> Policy:
        """proposers: what the request may draft with, in the order a fixed k prefers them; of
        those drafting inside the target's call, only the first (in_target_of)."""
        proposers = in_target_of(tuple(p for p in proposers if p in self.proposers),
                                 self.in_target)
        self.active += 1
        if not auto:
            return Fixed(self, proposers, num_draft_tokens, frozen)
        return Adaptive(self, proposers, min(num_draft_tokens, self.max_k), frozen)

    def close(self, policy: Policy) -> None:
        self.active -= 1
        if self.prober is policy:   # its probe never came back: let another sequence try
            self.prober = None

    def server_acceptance(self, proposer: Proposer) -> list[float]:
        return self.acceptance[proposer].rates(PRIOR_ACCEPTANCE[proposer],
                                               PRIOR_WEIGHT)

    def estimates(self) -> Estimates:
        c = self.costs_now()
        d0, v0 = c.propose_s(Proposer.DRAFT, 0), c.verify(0)
        d1, v1 = c.propose_s(Proposer.DRAFT, 1) - d0, c.verify(1) - v0
        return Estimates({p: self.server_acceptance(p) for p in DRAFTING}, {
            "draft_call": d0, "draft_token": d1, "verify_call": v0, "verify_token": v1,
            "other": c.other(0)})

    def width(self, proposer: Proposer) -> int:
        """The k that every row drafting with `proposer` takes at load. A batch costs what its
        widest row drafts (verification padded to it, a drafter's steps run for it), so a row
        drafting less than the widest saves nothing and commits less, and one drafting more
        widens every row's round. With rows choosing from their own estimates (and stretching
        apart), batches of 16 ran to their most confident row's k while most rows drafted
        less: auto 0.87x of K=4 on the H200's table, 0.94x with one width (docs/benchmarks.md,
        "One width a batch"). One k for all, from the server's acceptance and the load's costs
        (E(k)/T(k) summed over alike rows is one row's times their number), recomputed once a
        batch (as many rounds observed as there are rows) and kept unless another k beats it
        by WIDTH_MARGIN."""
        kept = self.widths.get(proposer)
        if kept is not None and self.rounds_seen - kept[1] < max(self.active, 1):
            return kept[0]
        rate = rates(self.server_acceptance(proposer), self.costs_now(), proposer)
        k = argmax(rate)
        if kept is not None and rate[k] < (1 + WIDTH_MARGIN) * rate[kept[0]]:
            k = kept[0]
        self.widths[proposer] = (k, self.rounds_seen)
        return k

    def costs_now(self) -> Costs:
        """The fit for the current load level, or the nearest level that has data."""
        level = _level(self.active)
        for d in range(_LEVELS):
            for lv in (level - d, level + d):
                if 0 <= lv < _LEVELS and self.costs[lv].observations >= 3:
                    return self.costs[lv]
        return self.costs[level]

    def observe(self, r: Round, policy: Policy) -> None:
        """A finished round of one sequence."""
        if r.failure:
            if r.proposer == Proposer.DRAFT:
                self._draft_failed(policy)
            return
        self.rounds_seen += 1
        if r.k:
            if r.proposer == Proposer.DRAFT and (self.prober is policy or self.failing):
                self.failing, self.prober = False, None
                self.backoff = self.down_s
            self.acceptance[r.proposer].add(r.k, r.accepted)
        if r.prefill:
            return                           # a prompt's prefill is not a steady-state round
        costs = self.costs[_level(self.active)]
        # x: what the call's cost grew with, the batch's widest row (Round.batch_k): at
        # load a row's own k barely moves a batch that others widen, and fitted on it every
        # row would see more drafts as free while together they slow every round.
        if r.k and r.draft_fed <= 2:         # a draft catching up on many tokens is a prefill
            costs.propose[r.proposer].add(r.drafted or r.k, r.draft_s)
        if r.ahead_s is not None:            # drafted a round ahead, for nothing
            costs.propose[r.ahead].add(r.discarded, r.ahead_s)
        costs.verify.add(r.k if r.batch_k is None else r.batch_k, r.verify_s)
        if r.other_s is not None:
            costs.other.add(0, r.other_s)

    def _draft_failed(self, policy: Policy) -> None:
        # Calls already in flight when the draft went down fail too: only the first failure
        # and a failed probe extend the backoff.
        if self.prober is policy or not self.failing:
            self.down_until = self.clock() + self.backoff
            self.backoff = min(self.backoff * 2, self.down_max_s)
        self.failing = True
        if self.prober is policy:
            self.prober = None

    def observe_probe(self, proposer: Proposer, seconds: float) -> None:
        """A probe's proposal took `seconds` (an off drafter's catch-up included)."""
        self.probe_s[proposer] += 0.5 * (seconds - self.probe_s[proposer])

    def draft_blocked(self, policy: Policy) -> bool:
        """The draft is down, or another sequence is probing it."""
        return self.failing and (self.clock() < self.down_until
                                 or self.prober not in (None, policy))

    def use_draft(self, policy: Policy) -> None:
        """policy drafts now; while the draft is failing, that makes it the probe."""
        if self.failing:
            self.prober = policy

    def capped(self, k: int) -> int:
        if self.load_cap is None:
            return k
        full_below, off_at = self.load_cap
        if self.active < full_below:
            return k
        if self.active >= off_at:
            return 0
        return int(k * (off_at - self.active) / (off_at - full_below + 1))


def in_target_of(proposers: tuple[Proposer, ...], in_target: frozenset[Proposer]
                 ) -> tuple[Proposer, ...]:
    """The proposers with only the first of those drafting inside the target's call: one
    verification drafts for one drafter, and an EAGLE-3 head must catch up on every verification
    of a sequence it drafts for."""
    first = next((p for p in proposers if p in in_target), None)
    return tuple(p for p in proposers if p not in in_target or p == first)
