"""How many tokens to draft, chosen per round from live acceptance and measured cost.

Leviathan et al. (2023, eq. 1) expect (1 - a^(K+1)) / (1 - a) tokens from a round of K drafts
when each draft is accepted with probability a, and price the round at c*K + 1 target passes.
Neither holds on a server: acceptance falls with the position in the draft and changes with the
sequence and its text, and every call carries a fixed cost while a verification's cost grows
with the batch. So, per sequence and per round:

    E(k) = 1 + sum_{j <= k} prod_{i <= j} a_i    a_i: acceptance at position i, given i-1 accepted
    T(k) = [k > 0] (d0 + d1 k) + v0 + v1 k + o   draft call, verify call, the loop's own time

with a_i counted per sequence (prior: what the server has seen) and the costs fitted online per
load level (active sequences), and the round takes the k in 0..limit that maximizes E(k) / T(k),
committed tokens per second. A draft that stops paying is turned off (k = 0) for that sequence;
probes of one token, ever rarer while they fail, turn it back on when the text becomes
predictable. A draft that fails (error, timeout, unavailable) is off for the whole server for a
backoff period; one probe at a time then tests it.

Policies by request:
- `Fixed`: num_draft_tokens = k, exactly k (0: target only) while the draft is up and no
  operator load cap lowers it.
- `Adaptive`: num_draft_tokens absent (auto, capped by max_draft_tokens), the estimates above.
- `Adaptive(frozen)`: auto for a seeded sampling request. Its sampled tokens depend on the round
  structure, so its k may depend only on its own acceptance history: the prior acceptance and
  the cost model are constants (`PRIOR`), never what other requests or the clock did.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

# Load levels (active sequences) with separate cost fits: 1, 2, 3-4, 5-8, ..., 65+.
_LEVELS = 8


def _level(active: int) -> int:
    return min(max(active - 1, 0).bit_length(), _LEVELS - 1)


def expected_tokens(acceptance: list[float]) -> list[float]:
    """E(k) for k = 0..len(acceptance): committed tokens from a round of k drafts."""
    out, reach = [1.0], 1.0
    for a in acceptance:
        reach *= a
        out.append(out[-1] + reach)
    return out


@dataclass
class LinearFit:
    """y ~ a + b x by exponentially weighted least squares; `prior` (a, b) holds until the data
    vary in x, and never fully lets go (ridge), so a fit from one x value stays sane."""
    prior: tuple[float, float]
    decay: float = 0.98           # about the last 50 observations count
    ridge: float = 1.0            # pseudo-observations pulling the slope to the prior's
    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y

    @property
    def coef(self) -> tuple[float, float]:
        a0, b0 = self.prior
        if self.n < 1e-9:
            return a0, b0
        mx, my = self.sx / self.n, self.sy / self.n
        var, cov = self.sxx - self.n * mx * mx, self.sxy - self.n * mx * my
        # The prior slope scaled to the observed level, so ridge pulls in proportion.
        level = my / max(a0 + b0 * mx, 1e-12)
        b = (cov + self.ridge * b0 * level) / (var + self.ridge)
        b = max(b, 0.0)                     # more tokens never cost less
        return max(my - b * mx, 0.0), b

    def __call__(self, x: float) -> float:
        a, b = self.coef
        return a + b * x


@dataclass
class Costs:
    """Seconds of a round's parts as functions of k, at one load level."""
    draft: LinearFit       # x = k >= 1: one draft call
    verify: LinearFit      # x = k: one verification call
    other: LinearFit       # x = 0: the loop's own time between calls (emit, bookkeeping)

    @classmethod
    def prior(cls, p: "PriorCosts") -> "Costs":
        return cls(LinearFit((p.draft_call, p.draft_token)),
                   LinearFit((p.verify_call, p.verify_token)), LinearFit((p.other, 0.0)))

    @property
    def observations(self) -> float:
        return self.verify.n

    def draft_s(self, k: int) -> float:
        if self.draft.n >= 1 or self.verify.n < 1:
            return self.draft(k)
        # No steady draft call measured yet (a poor draft only ever probes, and a probe catches
        # up on skipped tokens): the prior's draft, at the scale the verifications show.
        a, b = self.verify.prior
        mx = self.verify.sx / self.verify.n
        return self.draft(k) * (self.verify.sy / self.verify.n) / max(a + b * mx, 1e-12)

    def round_s(self, k: int) -> float:
        return (self.draft_s(k) if k else 0.0) + self.verify(k) + self.other(0)


@dataclass(frozen=True)
class PriorCosts:
    """What a fresh server assumes, in seconds, until it has measured (and what a frozen policy
    always uses). Relative sizes matter, not units: a draft step a tenth of a verification,
    fixed call costs that make one drafted token barely pay at the prior acceptance."""
    draft_call: float = 0.002
    draft_token: float = 0.001
    verify_call: float = 0.008
    verify_token: float = 0.0005
    other: float = 0.0005


PRIOR = PriorCosts()
PRIOR_ACCEPTANCE = 0.6    # per position, before anything is seen
PRIOR_WEIGHT = 2.0        # pseudo-rounds a sequence's own counts start from


@dataclass
class Acceptance:
    """Per-position acceptance counts with a prior and exponential forgetting.

    A round of k drafts with m accepted reached positions 1..min(m + 1, k) and accepted 1..m."""
    size: int
    decay: float
    reached: list[float] = field(default_factory=list)
    accepted: list[float] = field(default_factory=list)

    def __post_init__(self):
        self.reached = self.reached or [0.0] * self.size
        self.accepted = self.accepted or [0.0] * self.size

    def add(self, k: int, m: int) -> None:
        for j in range(self.size):
            self.reached[j] *= self.decay
            self.accepted[j] *= self.decay
        for j in range(min(m + 1, k, self.size)):
            self.reached[j] += 1.0
            if j < m:
                self.accepted[j] += 1.0

    def rates(self, prior: list[float], weight: float) -> list[float]:
        return [(a + weight * p) / (r + weight)
                for a, r, p in zip(self.accepted, self.reached, prior)]


@dataclass(frozen=True)
class Choice:
    k: int
    reason: str      # why k is below the limit: "", "acceptance", "draft_down", "load_cap"


@dataclass(frozen=True)
class Estimates:
    acceptance: list[float]          # server-wide, per position
    costs: dict[str, float]          # seconds: draft_call, draft_token, verify_call, ...


class Planner:
    """Server-wide: acceptance seen by all sequences, costs per load level, the draft's health.

    max_k: the largest k any request may use. load_cap: optional operator cap (full_below,
    off_at) on k by active sequences, as the earlier fixed load policy did; frozen (seeded
    sampling) requests are exempt, their k must not depend on load.
    """

    def __init__(self, max_k: int, load_cap: tuple[int, int] | None = None,
                 prior: PriorCosts = PRIOR, probe_every: int = 4, probe_max: int = 64,
                 down_s: float = 0.5, down_max_s: float = 10.0, clock=time.monotonic):
        self.max_k, self.load_cap, self.prior = max_k, load_cap, prior
        self.probe_every, self.probe_max = probe_every, probe_max
        self.down_s, self.down_max_s, self.clock = down_s, down_max_s, clock
        self.acceptance = Acceptance(max_k, decay=0.995)
        self.costs = [Costs.prior(prior) for _ in range(_LEVELS)]
        self.frozen_costs = Costs.prior(prior)
        self.active = 0
        # The draft's health: after a failure it is off for every sequence until `down_until`,
        # then one sequence at a time probes it; the backoff doubles while probes fail.
        self.failing = False
        self.down_until = 0.0
        self.backoff = down_s
        self.probing = False

    def open(self, num_draft_tokens: int, auto: bool, frozen: bool = False) -> "Policy":
        self.active += 1
        if not auto:
            return Fixed(self, num_draft_tokens, frozen)
        return Adaptive(self, min(num_draft_tokens, self.max_k), frozen)

    def close(self, policy: "Policy") -> None:
        self.active -= 1
        if policy.probing_draft:   # its probe never came back: let another sequence try
            self.probing = policy.probing_draft = False

    def server_acceptance(self) -> list[float]:
        return self.acceptance.rates([PRIOR_ACCEPTANCE] * self.max_k, PRIOR_WEIGHT)

    def estimates(self) -> Estimates:
        c = self.costs_now()
        d0, v0 = c.draft_s(0), c.verify(0)
        d1, v1 = c.draft_s(1) - d0, c.verify(1) - v0
        return Estimates(self.server_acceptance(), {
            "draft_call": d0, "draft_token": d1, "verify_call": v0, "verify_token": v1,
            "other": c.other(0)})

    def costs_now(self) -> Costs:
        """The fit for the current load level, or the nearest level that has data."""
        level = _level(self.active)
        for d in range(_LEVELS):
            for lv in (level - d, level + d):
                if 0 <= lv < _LEVELS and self.costs[lv].observations >= 3:
                    return self.costs[lv]
        return self.costs[level]

    def observe(self, r, policy: "Policy") -> None:
        """A finished round (loop.Round) of one sequence."""
        if r.failure:
            self._draft_failed(policy)
            return
        if r.k:
            if policy.probing_draft or self.failing:
                self.failing = self.probing = policy.probing_draft = False
                self.backoff = self.down_s
            self.acceptance.add(r.k, r.accepted)
        if r.prefill:
            return                           # a prompt's prefill is not a steady-state round
        costs = self.costs[_level(self.active)]
        if r.k and r.draft_fed <= 2:         # a draft catching up on many tokens is a prefill
            costs.draft.add(r.k, r.draft_s)
        costs.verify.add(r.k, r.verify_s)
        if r.other_s is not None:
            costs.other.add(0, r.other_s)

    def _draft_failed(self, policy: "Policy") -> None:
        # Calls already in flight when the draft went down fail too: only the first failure
        # and a failed probe extend the backoff.
        if policy.probing_draft or not self.failing:
            self.down_until = self.clock() + self.backoff
            self.backoff = min(self.backoff * 2, self.down_max_s)
        self.failing = True
        if policy.probing_draft:
            self.probing = policy.probing_draft = False

    def draft_usable(self, policy: "Policy") -> bool:
        """False while the draft is down; after that, true for one probing sequence at a time."""
        if not self.failing:
            return True
        if self.clock() < self.down_until or (self.probing and not policy.probing_draft):
            return False
        self.probing = policy.probing_draft = True
        return True

    def capped(self, k: int) -> int:
        if self.load_cap is None:
            return k
        full_below, off_at = self.load_cap
        if self.active < full_below:
            return k
        if self.active >= off_at:
            return 0
        return int(k * (off_at - self.active) / (off_at - full_below + 1))


class Policy:
    probing_draft = False     # this sequence is the one testing a draft that failed

    def __init__(self, planner: Planner):
        self.planner = planner

    def choose(self, limit: int) -> Choice:
        raise NotImplementedError

    def observe(self, r) -> None:
        self.planner.observe(r, self)


class Fixed(Policy):
    def __init__(self, planner: Planner, k: int, frozen: bool):
        super().__init__(planner)
        self.k, self.frozen = k, frozen

    def choose(self, limit: int) -> Choice:
        k = min(self.k, limit)
        if k and not self.frozen:
            k = self.planner.capped(k)
            if k == 0:
                return Choice(0, "load_cap")
        if k and not self.planner.draft_usable(self):
            return Choice(0, "draft_down")
        return Choice(k, "")


class Adaptive(Policy):
    def __init__(self, planner: Planner, cap: int, frozen: bool):
        super().__init__(planner)
        self.cap, self.frozen = cap, frozen
        self.own = Acceptance(planner.max_k, decay=0.9)
        self.prior = ([PRIOR_ACCEPTANCE] * planner.max_k if frozen
                      else planner.server_acceptance())
        self.off_rounds = 0                    # rounds at k = 0 since the last probe
        # Where the server's drafts are rarely accepted, a new sequence waits longer before it
        # probes: about one probe per accepted token the server's rate promises.
        a1 = self.prior[0] if self.prior else 1.0
        self.probe_every = planner.probe_every if frozen else int(min(
            planner.probe_max, max(planner.probe_every, planner.probe_every / max(a1, 1e-3))))
        self.probe = False                     # this round's k = 1 is a probe

    def acceptance(self) -> list[float]:
        return self.own.rates(self.prior, PRIOR_WEIGHT)

    def costs(self) -> Costs:
        return self.planner.frozen_costs if self.frozen else self.planner.costs_now()

    def choose(self, limit: int) -> Choice:
        cap = min(self.cap, limit)
        if cap and not self.frozen:
            capped = self.planner.capped(cap)
            if capped == 0:
                return Choice(0, "load_cap")
            cap = capped
        if cap == 0:
            return Choice(0, "")
        costs = self.costs()
        k = best_k(self.acceptance()[:cap], costs)
        self.probe = False
        if k == 0:
            self.off_rounds += 1
            # Probe only where a draft that is always right would pay at all.
            if self.off_rounds < self.probe_every or best_k([1.0] * cap, costs) == 0:
                return Choice(0, "acceptance")
            self.off_rounds, self.probe, k = 0, True, 1
        else:
            self.off_rounds = 0
        if not self.planner.draft_usable(self):
            return Choice(0, "draft_down")
        return Choice(k, "")

    def observe(self, r) -> None:
        super().observe(r)
        if r.failure or not r.k:
            return
        self.own.add(r.k, r.accepted)
        if self.probe:   # back off while probes fail; a passing probe resets the interval
            self.probe_every = (self.planner.probe_every if r.accepted
                                else min(self.probe_every * 2, self.planner.probe_max))


def best_k(acceptance: list[float], costs: Costs) -> int:
    """argmax over k = 0..len(acceptance) of E(k) / T(k); ties go to the smaller k."""
    e = expected_tokens(acceptance)
    best, best_rate = 0, -math.inf
    for k, tokens in enumerate(e):
        rate = tokens / max(costs.round_s(k), 1e-9)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best
