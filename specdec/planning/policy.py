"""How many tokens to draft, and from which proposer, chosen per round from live acceptance and
measured cost (estimates.py).

Each round of each sequence takes the proposer and the k in 0..limit that maximize expected
committed tokens per second, E(k) / T(k), with acceptance counted per sequence and proposer
(prior: what the server has seen) and costs fitted online per load level (active sequences), so
verification's growing cost under load lowers k by measurement; at load every row drafting
with a proposer takes one k, the batch's width (Planner.width), since the batch costs what its
widest row drafts and a row drafting less saves no one anything. A proposer that stops
paying is off (k = 0) for that sequence; probes of one token, ever rarer while they fail, turn it
back on when the text becomes predictable. A draft model that fails (error, timeout,
unavailable) is off for the whole server for a backoff period; one probe at a time then tests it
(planner.py: what every sequence shares).

Policies by request:
- `Fixed`: num_draft_tokens = k, exactly k (0: target only) while the draft is up and no
  operator load cap lowers it. Hybrid: the n-gram proposal when a match exists, else the
  in-target drafter's, else the draft's.
- `Adaptive`: num_draft_tokens absent (auto, capped by max_draft_tokens), the estimates above.
- `Adaptive(frozen)`: auto for a seeded sampling request. Its sampled tokens depend on the round
  structure, so its choices may depend only on its own history: the prior acceptance and the
  cost model are constants (`PRIOR`), never what other requests or the clock did.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from .estimates import PRIOR_ACCEPTANCE, SEQUENCE_WEIGHT, Acceptance, Costs, best
from ..records import Off, Proposer, Round


class Shared(Protocol):
    """What a sequence's policy reads of, and tells, the server-wide planner (planner.Planner,
    which makes the policies: this module is below it). The planner owns all of it."""
    max_k: int
    active: int                       # sequences open
    in_target: frozenset[Proposer]
    probe_every: int
    probe_max: int
    probe_s: dict[Proposer, float]    # what a probe's proposal took (observe_probe)
    frozen_costs: Costs

    def server_acceptance(self, proposer: Proposer) -> list[float]: ...
    def costs_now(self) -> Costs: ...
    def width(self, proposer: Proposer) -> int: ...
    def capped(self, k: int) -> int: ...
    def draft_blocked(self, policy: "Policy") -> bool: ...
    def use_draft(self, policy: "Policy") -> None: ...
    def observe(self, r: Round, policy: "Policy") -> None: ...
    def observe_probe(self, proposer: Proposer, seconds: float) -> None: ...

# Every STRETCH_EVERY-th round that drafts, one token more than the estimates' best: the
# position beyond is measured now and then, or one unlucky rejection there would keep k below
# it for as long as the estimate takes to forget. Not at load, where each row's stretch widened
# the whole batch (most batches of 16 had a row stretching): there the width grows where the
# position past it, assumed to accept like the last one drafted, says it pays.
STRETCH_EVERY = 8
# A proposer that is off is probed now and then; at most this share of a batch's time goes to
# probes. A probe widens its whole batch's round by the proposer's step, and each row probes on
# its own: with SWIFT on a target where a skipped-layer step costs 0.95 of a verification,
# probes every few rounds of each of 16 rows took 39 % of the served tok/s (docs/swift.md).
PROBE_SHARE = 0.03
# Proposers that look their drafts up in committed text, in the orchestrator's process.
LOOKUPS = (Proposer.NGRAM, Proposer.SUFFIX)
# Rounds a choice of no drafts is held without choosing again (Held). Choosing costs 25-30 us a
# row a round in Python; with an untrained draft, never drafting at 16 streams, it and the
# lookahead's were 0.88x of target-only served on the CPU.
HOLD_ROUNDS = 8


@dataclass(frozen=True)
class Choice:
    k: int
    reason: Off | None = None   # why k is 0 though drafts were allowed
    proposer: Proposer = Proposer.DRAFT


@dataclass(frozen=True)
class Offer:
    most: int   # the most a proposer offers this round
    own: int    # the k its own estimates draft (0: it is off)


@dataclass
class Weighed:
    """A round's offers, weighed (Adaptive._weigh)."""
    best: tuple[int, Proposer | None]   # the k and proposer of the highest rate; (0, None)
    offers: dict[Proposer, Offer]       # every proposer weighed
    why: Off                            # why none offers, where none does
    holdable: bool                      # False: the draft is down, asked again each round


@dataclass
class Held:
    """A choice of no drafts, held for a few rounds (HOLD_ROUNDS): while its proposers offer
    what they offered then and none is due a probe, choosing again would give it again (a frozen
    policy reads nothing that changes meanwhile; a live one reads server-wide estimates that
    move little in a few rounds)."""
    offers: dict[Proposer, int]   # the most each offered (0: none)
    due: dict[Proposer, float]    # those weighed: off_rounds when a probe is due (inf: never)
    rounds: int                   # rounds it holds yet


class Policy:
    def __init__(self, planner: Shared, proposers: tuple[Proposer, ...], frozen: bool):
        self.planner, self.proposers, self.frozen = planner, proposers, frozen

    def choose(self, limit: int, available: dict[Proposer, int] | None = None) -> Choice:
        """k in 0..limit and its proposer. available: the most each proposer the sequence has
        can offer now (n-gram: its match's continuation); the policy's other proposers are not
        there (a hybrid request on a server without a head). None: all can offer the limit."""
        raise NotImplementedError

    def _offered(self, available: dict[Proposer, int] | None) -> tuple[Proposer, ...]:
        if available is None:
            return self.proposers
        return tuple(p for p in self.proposers if p in available)

    @property
    def ahead(self) -> Proposer | None:
        """The proposer that drafts inside the target's call for this sequence (at most one)."""
        return next((p for p in self.proposers if p in self.planner.in_target), None)

    def lookahead(self, limit: int) -> int:
        """Tokens `ahead` should draft now, with this round's verification, for the next round,
        whose limit is at most `limit`: its proposal is made a round ahead, and the next round's
        choice takes what it needs of it."""
        raise NotImplementedError

    def observe(self, r: Round) -> None:
        self.planner.observe(r, self)

    def _cap(self, k: int) -> int:
        return k if self.frozen else self.planner.capped(k)

    def _room(self, k: int) -> int | Choice:
        """k under the operator's load cap, or the choice of none where none is left."""
        if k and self._cap(k) == 0:
            return Choice(0, Off.LOAD_CAP)
        k = self._cap(k)
        return k or Choice(0)

    def _draft(self, k: int) -> Choice:
        if Proposer.DRAFT in self.planner.in_target:   # it fails like a head: per round
            return Choice(k, None, Proposer.DRAFT)
        if self.planner.draft_blocked(self):
            return Choice(0, Off.DRAFT_DOWN)
        self.planner.use_draft(self)
        return Choice(k, None, Proposer.DRAFT)


class Fixed(Policy):
    def __init__(self, planner: Shared, proposers: tuple[Proposer, ...], k: int, frozen: bool):
        super().__init__(planner, proposers, frozen)
        self.k = k

    def choose(self, limit: int, available: dict[Proposer, int] | None = None) -> Choice:
        k = self._room(min(self.k, limit))
        if isinstance(k, Choice):
            return k
        last = self.proposers[-1]
        for p in self._offered(available):
            if p == Proposer.DRAFT and p not in self.planner.in_target:
                return self._draft(k)
            offer = (available or {}).get(p, k)
            if offer > 0:
                return Choice(min(k, offer), None, p)
            last = p
        return Choice(0, Off.NO_MATCH, last)

    def lookahead(self, limit: int) -> int:
        return self._cap(min(self.k, limit)) if self.ahead else 0


class Adaptive(Policy):
    def __init__(self, planner: Shared, proposers: tuple[Proposer, ...], cap: int, frozen: bool):
        super().__init__(planner, proposers, frozen)
        self.cap = cap
        self.own = {p: Acceptance(planner.max_k, decay=0.97) for p in proposers}
        self.off_rounds = {p: 0 for p in proposers}   # rounds offered, not chosen, since a probe
        # Where the server's proposals are rarely accepted, a new sequence waits longer before
        # it probes: about one probe per accepted token the server's rate promises.
        every = planner.probe_every
        self.probe_every = {p: every if frozen else int(min(
            planner.probe_max, max(every, every / max(self.acceptance(p)[0], 1e-3))))
            for p in proposers}
        self.probe: Proposer | None = None   # the proposer this round's k = 1 probes
        self.idle_ahead = 0   # rounds the in-target drafter, off, was asked for nothing
        self.drafted_rounds = 0
        self.held: Held | None = None
        # The lookahead's decision that `ahead` is off and dear, held this many rounds more
        # (its probes every ahead_every rounds): choosing it again costs as choose does.
        self.ahead_held, self.ahead_every = 0, 0

    def acceptance(self, proposer: Proposer) -> list[float]:
        """The sequence's own counts over a prior: the server's live estimate (a sequence
        starts from what the server has seen), or when frozen a constant.

        The server's estimate weighs more as sequences share the batch: a batch costs what its
        widest row drafts, so a row whose own luck lifts its k above the others' slows all of
        them; at load the rows choose from one estimate, mostly, and so alike."""
        if self.frozen:
            return self.own[proposer].rates(PRIOR_ACCEPTANCE[proposer], SEQUENCE_WEIGHT)
        return self.own[proposer].rates(self.planner.server_acceptance(proposer),
                                        SEQUENCE_WEIGHT * max(1, self.planner.active))

    def costs(self) -> Costs:
        return self.planner.frozen_costs if self.frozen else self.planner.costs_now()

    def choose(self, limit: int, available: dict[Proposer, int] | None = None) -> Choice:
        cap = self._room(min(self.cap, limit))
        if isinstance(cap, Choice):
            return cap
        if self._still_held(cap, available):
            return Choice(0, Off.ACCEPTANCE)
        self.held, self.probe = None, None
        costs = self.costs()
        w = self._weigh(cap, available, costs)
        k, p = self._probe_one_off(w, costs) or w.best
        shared = k > 0 and self.probe is None and self._shared()
        if shared:
            # The batch's width, or all a drafter in the target drafted a round ahead (the
            # width then): drafting less than the widest row saves no row anything.
            most = w.offers[p].most
            k = most if p == self.ahead else min(self._width(p), most)
        if k == 0:
            if w.offers and w.holdable:
                self._hold(cap, available, w.offers, costs)
            return Choice(0, Off.ACCEPTANCE if w.offers else w.why)
        self.drafted_rounds += 1
        if not shared and self.probe is None and self.drafted_rounds % STRETCH_EVERY == 0:
            k = min(k + 1, w.offers[p].most)   # the position past the best, now and then
        return self._draft(k) if p == Proposer.DRAFT else Choice(k, None, p)

    def _weigh(self, cap: int, available: dict[Proposer, int] | None, costs: Costs) -> Weighed:
        """Each offered proposer's best k on its own estimates, and the best of them all
        against drafting nothing."""
        w = Weighed(best=(0, None), offers={}, why=Off.NO_MATCH, holdable=True)
        best_rate = 1.0 / max(costs.round_s(None, 0), 1e-9)
        for p in self._offered(available):
            most = min(cap, (available or {}).get(p, cap))
            if most == 0:
                if p == self.ahead and self.idle_ahead:   # lookahead left it off: no proposal
                    w.why = Off.ACCEPTANCE
                continue
            if p == Proposer.DRAFT and p not in self.planner.in_target and \
                    self.planner.draft_blocked(self):
                w.why, w.holdable = Off.DRAFT_DOWN, False   # asked each round: it may probe
                continue
            k, rate = best(self.acceptance(p)[:most], costs, p)
            w.offers[p] = Offer(most, k)
            if k and rate > best_rate * (1 + 1e-9):
                best_rate, w.best = rate, (k, p)
        return w

    def _probe_one_off(self, w: Weighed, costs: Costs) -> tuple[int, Proposer] | None:
        """A proposer that is off (its own estimate drafts nothing) is tried now and then, or
        it would never be learned again: a draft with one token, a lookup or a head (whose
        tokens cost only their verification now) with all it has; only where a proposal that
        is always right would pay at all. One that pays but was beaten this round is not: it is
        measured where it wins, and a probe would spend a round on what the estimates say is
        the lesser proposal (a lookup's text drafted with a draft model's BLS call for one
        token, every few rounds of copying). Counts each offer's rounds off on the way."""
        chosen = w.best[1]
        for q, offer in w.offers.items():
            if q == chosen:
                self.off_rounds[q] = 0
                continue
            self.off_rounds[q] += 1
            if not offer.own and self.off_rounds[q] >= self._probe_every(q, costs) \
                    and best([1.0] * offer.most, costs, q)[0]:
                self.off_rounds[q], self.probe = 0, q
                return (1 if q == Proposer.DRAFT else offer.most), q
        return None

    def _still_held(self, cap: int, available: dict[Proposer, int] | None) -> bool:
        """Whether this round holds the last choice of no drafts (Held); its rounds count as
        chosen: off_rounds advance."""
        held = self.held
        if held is None or held.rounds == 0 or self._offers(cap, available) != held.offers:
            return False
        if any(self.off_rounds[p] + 1 >= due for p, due in held.due.items()):
            return False
        held.rounds -= 1
        self.probe = None
        for p in held.due:
            self.off_rounds[p] += 1
        return True

    def _offers(self, cap: int, available: dict[Proposer, int] | None) -> dict[Proposer, int]:
        return {p: min(cap, (available or {}).get(p, cap)) for p in self._offered(available)}

    def _hold(self, cap: int, available: dict[Proposer, int] | None,
              offers: dict[Proposer, Offer], costs: Costs) -> None:
        """Hold this choice of no drafts (every proposer in `offers`, the ones choose weighed,
        is off and none probed)."""
        due = {q: self._probe_every(q, costs) if best([1.0] * o.most, costs, q)[0]
               else math.inf for q, o in offers.items()}
        self.held = Held(self._offers(cap, available), due, HOLD_ROUNDS)

    def _shared(self) -> bool:
        """Whether this row drafts the batch's width (Planner.width): at load, unless frozen."""
        return not self.frozen and self.planner.active > 1

    def _width(self, p: Proposer) -> int:
        """The batch's width for p; a lookup reaches at most one past the row's model
        drafter's width: a long match a row trusts would widen every row's verification for
        its own gain (a fifth of lookups 8 long, the rest 2 or 3: 0.77x of the best fixed k
        uncapped, 0.96x one past). One past, so that a lookup's own length can still show."""
        w = self.planner.width(p)
        if p in LOOKUPS:
            models = [q for q in self.proposers if q not in LOOKUPS]
            if models:
                w = min(w, max(self.planner.width(q) for q in models) + 1)
        return w

    def lookahead(self, limit: int) -> int:
        cap = self._cap(min(self.cap, limit))
        p = self.ahead
        if p is None or cap == 0:
            return 0
        if self.ahead_held:   # off and dear, as below, a few rounds more
            self.ahead_held -= 1
            return self._idle_ahead(p, self.ahead_every)
        # What the next round will take: the estimates' best, one more when that round
        # stretches (its choice reaches one past the best). Every step drafted runs over the
        # whole batch, so a step drafted every round for the one round in STRETCH_EVERY that
        # uses it costs every row a step.
        costs = self.costs()
        k = best(self.acceptance(p)[:cap], costs, p)[0]
        stretches = (self.drafted_rounds + 1) % STRETCH_EVERY == 0
        if k == 0 and _step_dear(p, costs):
            # Off, and its token dear: one token only for the round that will probe it, or
            # every round would pay a step for drafts thrown away. One within PROBE_SHARE of
            # a round is cheap: it drafts one every round, ready to probe.
            self.ahead_every, self.ahead_held = self._rounds_between_probes(p, costs), HOLD_ROUNDS
            return self._idle_ahead(p, self.ahead_every)
        self.idle_ahead = 0
        if self._shared():
            return min(cap, max(1, self._width(p)))
        return min(cap, max(1, k + stretches))

    def _idle_ahead(self, p: Proposer, every: int) -> int:
        """Nothing, but one token every `every` rounds, for the round that will probe it."""
        self.idle_ahead += 1
        if self.idle_ahead < every:
            return 0
        self.idle_ahead = 0
        self.off_rounds[p] = every   # the next choice probes what it drafts
        return 1

    def _probe_every(self, p: Proposer, costs: Costs) -> int:
        """Rounds between this sequence's probes of p: its backoff, and where p's step is dear
        no fewer than keep the batch's probes (every row's, each adding a one-token round's
        extra to the batch) within PROBE_SHARE of its time. A cheap step's probes cost less
        than that share's resolution (a head drafts one every round anyway)."""
        if _step_dear(p, costs):
            return self._rounds_between_probes(p, costs)
        return self.probe_every[p]

    def _rounds_between_probes(self, p: Proposer, costs: Costs) -> int:
        """A dear p's rounds between probes: its backoff, at least the batch's share. A probe
        costs a one-token round's extra, or what p's probes took where that is more (their
        catch-up; a frozen policy's choices depend on its own history only: the cost model
        alone)."""
        plain = max(costs.round_s(None, 0), 1e-9)
        extra = max(costs.round_s(p, 1) - plain, 0.0)
        if not self.frozen:
            extra = max(extra, self.planner.probe_s[p])
        rows = max(1, self.planner.active)
        return max(self.probe_every[p], math.ceil(rows * extra / (PROBE_SHARE * plain)))

    def observe(self, r: Round) -> None:
        super().observe(r)
        if r.failure or not r.k:
            return
        self.ahead_held = 0   # what it learned may turn `ahead` back on
        self.own[r.proposer].add(r.k, r.accepted)
        if self.probe == r.proposer:
            self.planner.observe_probe(r.proposer, r.draft_s)
            # Back off while probes fail; a passing one resets.
            every = self.probe_every[r.proposer]
            self.probe_every[r.proposer] = (self.planner.probe_every if r.accepted
                                            else min(every * 2, self.planner.probe_max))


def _step_dear(p: Proposer, costs: Costs) -> bool:
    """A token of it costs more than PROBE_SHARE of a round: drafted every round while off,
    ready to probe, it would cost every round more than probes may (a draft model, the target
    with layers skipped, a head on a small target, Medusa's heads where their LM heads weigh
    like the target's); not a lookup. A threshold above the share flipped by noise: a 1B draft's
    step at 16 rows of an 8B target is 0.12 of its verification on an H200, and wherever it
    read under 0.1 the batch drafted a token a round that no row used (0.64 of target-only
    served, 2026-11-27). A token is the fit's slope, but Medusa's: its heads run once for all
    the tokens asked, and not at all in a round that asks none (0.85x of target-only served
    on the CPU, never chosen, where they weigh 0.8 of the target)."""
    spent = costs.propose_s(p, 1) - (0.0 if p == Proposer.MEDUSA else costs.propose_s(p, 0))
    return spent > PROBE_SHARE * costs.round_s(None, 0)
