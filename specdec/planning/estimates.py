"""What the draft-length policy (policy.py) decides from: acceptance by position and the costs of
a round's parts, estimated online with forgetting and a prior.

    E(k) = 1 + sum_{j <= k} prod_{i <= j} a_i   a_i: acceptance at position i, given i-1 accepted
    T(k) = propose(k) + verify(k) + other       seconds: proposer's call, target's, the loop's own

Leviathan et al. (2023, eq. 1) is the special case of equal a_i and T = c*k + 1 target passes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..records import IN_TARGET, Proposer


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
    # coef until the next add: a policy reads each fit about 25 times a row a round (16 rows'
    # choices were 1.3 ms of a 10 ms round on the H200's host)
    _coef: tuple[float, float] | None = field(default=None, repr=False, compare=False)

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.n, self.sx, self.sy = d * self.n + 1, d * self.sx + x, d * self.sy + y
        self.sxx, self.sxy = d * self.sxx + x * x, d * self.sxy + x * y
        self._coef = None

    @property
    def coef(self) -> tuple[float, float]:
        if self._coef is None:
            self._coef = self._fit()
        return self._coef

    def _fit(self) -> tuple[float, float]:
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

    def level(self) -> float | None:
        """Observed mean over the prior's prediction at the observed mean x (None: no data)."""
        if self.n < 1:
            return None
        a, b = self.prior
        return (self.sy / self.n) / max(a + b * self.sx / self.n, 1e-12)


@dataclass(frozen=True)
class PriorCosts:
    """What a fresh server assumes, in seconds, until it has measured (and what a frozen policy
    always uses). Relative sizes matter, not units: a draft step a tenth of a verification,
    fixed call costs that make one drafted token barely pay at the prior acceptance, and a
    lookup in the orchestrator's own process next to nothing."""
    draft_call: float = 0.002
    draft_token: float = 0.001
    verify_call: float = 0.008
    verify_token: float = 0.0005
    other: float = 0.0005
    ngram_call: float = 0.00002
    ngram_token: float = 0.000002
    suffix_call: float = 0.00005     # two trees looked up in the orchestrator's process
    suffix_token: float = 0.000002
    eagle_call: float = 0.0004       # the head's catch-up, inside the verification's call
    eagle_token: float = 0.0004
    medusa_token: float = 0.0001     # all heads at once, on one hidden state
    self_token: float = 0.004        # the target with about half its layers skipped


PRIOR = PriorCosts()


@dataclass
class Costs:
    """Seconds of a round's parts as functions of k, at one load level."""
    propose: dict[Proposer, LinearFit]   # per proposer, x = k >= 1: one proposal
    verify: LinearFit               # x = k: one verification
    other: LinearFit                # x = 0: the loop's own time between calls
    in_target: frozenset[Proposer] = frozenset(IN_TARGET)   # draft inside the verification

    @classmethod
    def prior(cls, p: PriorCosts, in_target: frozenset[Proposer] = frozenset(IN_TARGET)
              ) -> "Costs":
        """in_target: the proposers that draft inside the target's call; a draft model there
        pays no call of its own (the head's catch-up prior stands for its feed)."""
        draft_call = p.eagle_call if Proposer.DRAFT in in_target else p.draft_call
        return cls({Proposer.DRAFT: LinearFit((draft_call, p.draft_token)),
                    Proposer.NGRAM: LinearFit((p.ngram_call, p.ngram_token)),
                    Proposer.SUFFIX: LinearFit((p.suffix_call, p.suffix_token)),
                    Proposer.EAGLE: LinearFit((p.eagle_call, p.eagle_token)),
                    Proposer.MEDUSA: LinearFit((p.eagle_call, p.medusa_token)),
                    Proposer.SELF: LinearFit((p.eagle_call, p.self_token))},
                   LinearFit((p.verify_call, p.verify_token)), LinearFit((p.other, 0.0)),
                   in_target)

    @property
    def observations(self) -> float:
        return self.verify.n

    def propose_s(self, proposer: Proposer, k: int) -> float:
        fit = self.propose[proposer]
        level = self.verify.level()
        if fit.n >= 1 or level is None:
            return fit(k)
        # No steady proposal measured yet (a poor draft only ever probes, and a probe catches
        # up on skipped tokens): the prior's, at the scale the verifications show.
        return fit(k) * level

    def catches_up(self, proposer: Proposer | None) -> bool:
        """Whether its fit's intercept is paid drafting or not: an in-target drafter's, but
        Medusa's heads, which run once for every token asked and not at all for none."""
        return proposer in self.in_target and proposer != Proposer.MEDUSA

    def round_line(self, proposer: Proposer) -> tuple[float, float, float]:
        """(T(0), a, b): round_s(proposer, k) is T(0) at k = 0 and a + b k for k >= 1, read
        once for every k (a policy weighs each k of each proposer, each row, each round)."""
        fit, level = self.propose[proposer], self.verify.level()
        pa, pb = fit.coef
        if fit.n < 1 and level is not None:
            pa, pb = pa * level, pb * level
        va, vb = self.verify.coef
        plain = va + self.other(0)
        if self.catches_up(proposer):
            return plain, plain, pb + vb
        return plain, pa + plain, pb + vb

    def round_s(self, proposer: Proposer | None, k: int) -> float:
        drafting = self.propose_s(proposer, k) if k else 0.0
        if k and self.catches_up(proposer):
            # It drafts inside every verification of a sequence that uses it, and catches up
            # there drafting or not (an EAGLE-3 head's cache must hold every position): only its
            # steps are this choice's.
            drafting -= self.propose_s(proposer, 0)
        return drafting + self.verify(k) + self.other(0)


# Per position, before anything is measured.
PRIOR_ACCEPTANCE = {Proposer.DRAFT: 0.6, Proposer.NGRAM: 0.5, Proposer.EAGLE: 0.6,
                    Proposer.MEDUSA: 0.5, Proposer.SELF: 0.6, Proposer.SUFFIX: 0.5}
PRIOR_WEIGHT = 2.0          # pseudo-rounds of PRIOR_ACCEPTANCE in the server's estimate
# Pseudo-rounds of the server's estimate in a sequence's own (with the sequence's forgetting,
# 0.97 a round, they keep its estimate from chasing a few rounds' luck where E(k)/T(k) is flat).
SEQUENCE_WEIGHT = 4.0


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

    def rates(self, prior: float | list[float], weight: float) -> list[float]:
        """Acceptance at each position, `weight` pseudo-rounds of the prior mixed in. A list
        gives each position's prior; a number is position 1's, and each later position's prior
        is the estimate at the position before it: positions a policy has not yet drafted
        are assumed to accept like the last one it has, so that k can grow past where it
        started (conditional acceptance varies little with the position)."""
        out: list[float] = []
        for j, (a, r) in enumerate(zip(self.accepted, self.reached)):
            p = prior[j] if isinstance(prior, list) else (out[-1] if out else prior)
            out.append((a + weight * p) / (r + weight))
        return out


def rates(acceptance: list[float], costs: Costs, proposer: Proposer) -> list[float]:
    """E(k) / T(k), expected committed tokens a second, for k = 0..len(acceptance)."""
    t0, a, b = costs.round_line(proposer)
    return [tokens / max(a + b * k if k else t0, 1e-9)
            for k, tokens in enumerate(expected_tokens(acceptance))]


def argmax(rate: list[float]) -> int:
    """The k of the highest rate; ties go to smaller k."""
    top, top_rate = 0, -math.inf
    for k, r in enumerate(rate):
        if r > top_rate * (1 + 1e-9):
            top, top_rate = k, r
    return top


def best(acceptance: list[float], costs: Costs, proposer: Proposer) -> tuple[int, float]:
    """(k, rate): the argmax over k = 0..len(acceptance) of E(k) / T(k); ties go to smaller k."""
    rate = rates(acceptance, costs, proposer)
    k = argmax(rate)
    return k, rate[k]


def best_k(acceptance: list[float], costs: Costs, proposer: Proposer = Proposer.DRAFT) -> int:
    return best(acceptance, costs, proposer)[0]
