"""The draft model in the target's process (in_target.ColocatedDraft): the verification of round
r drafts round r + 1. Its proposals are the separate draft's, drawn with the same seeded
positions, so both placements give the same tokens, and the separate one is exact
(test_speculative_exact.py, test_speculative_distribution.py)."""
import pytest
import torch

from specdec.proposers.colocated import ColocatedDraft
from specdec.planning.planner import Planner
from specdec.records import IN_TARGET, Proposer, Request
from specdec.runtime.sampling import SamplingParams
from specdec.hooks.faults import fail_drafters
from tests.core.conftest import engines, generate
from tests.core.test_speculative_distribution import (AcceptanceOnly, LENGTH, PROMPT,
                                                      assert_follows, tally)
from tests.core.test_speculative_exact import MAX_TOKENS, prompts

DRAFT = Proposer.DRAFT


def colocated(pair, **kw):
    """The target engine with the draft engine attached in its process."""
    target, draft = engines(pair, **kw)
    target.add_drafter(DRAFT, ColocatedDraft(draft))
    return target, draft


def target_alone(pair, prompts_) -> list[list[int]]:
    target, draft = engines(pair)
    return [r[0] for r in generate(target, draft, [Request(p, MAX_TOKENS, 0) for p in prompts_])]


class ColocatedPlanner(AcceptanceOnly):
    def __init__(self, max_k):
        super().__init__(max_k)
        self.in_target = frozenset(IN_TARGET + (DRAFT,))


def sampled(i: int) -> SamplingParams:
    return SamplingParams(temperature=0.9, top_k=0, top_p=0.95, seed=1_000_003 * i + 7)


@pytest.mark.parametrize("k,auto,greedy", [
    (1, False, True), (5, False, True), (8, True, True), (3, False, False),
    # Not sampled at auto: k follows each placement's own costs there, and sampled tokens follow
    # the rounds (test_colocated_samples_follow_target covers that).
])
def test_colocated_tokens_equal_the_separate_drafts(pair_dir, k, auto, greedy):
    reqs = [Request(p, MAX_TOKENS, k, SamplingParams() if greedy else sampled(i), auto=auto)
            for i, p in enumerate(prompts())]
    target, draft = engines(pair_dir)
    apart = generate(target, draft, reqs, planner=AcceptanceOnly(8) if auto else None)
    target, draft = colocated(pair_dir)
    rounds = []
    together = generate(target, None, reqs, planner=ColocatedPlanner(8) if auto else None,
                        on_round=rounds.append)
    assert [r[0] for r in together] == [r[0] for r in apart]
    drafted = [r for r in rounds if r.k]
    assert drafted and all(r.proposer == DRAFT for r in drafted)
    accepted = sum(r.accepted for r in drafted)
    assert 0 < accepted < sum(r.k for r in drafted)     # neither path idle
    assert target.pool.active == 0 and draft.pool.active == 0 and not target.q
    drafter = target.drafters[DRAFT]
    assert not drafter.history and not drafter.held and not drafter.fed


def test_greedy_equals_target_alone(pair_dir):
    alone = target_alone(pair_dir, prompts())
    target, _ = colocated(pair_dir)
    for k in (2, 4):
        got = generate(target, None, [Request(p, MAX_TOKENS, k) for p in prompts()])
        assert [r[0] for r in got] == alone


def test_colocated_samples_follow_target(small_pair):
    """The draft drafts from the first verification on: of LENGTH tokens, the first is the
    target's own, the second round drafts one (its limit), the last is a round's bonus or
    correction."""
    n, k = 4000, 2
    target, _ = colocated(small_pair, max_sequences=n, max_len=16)
    params = SamplingParams(temperature=1.0)
    reqs = [Request(PROMPT, LENGTH, k, SamplingParams(1.0, seed=1_000_003 * i + 7),
                    prefill_alone=False) for i in range(n)]
    results = generate(target, None, reqs)
    counts = tally(results)
    proposed = sum(s.total_draft_tokens for _, s, _ in results)
    rate = sum(s.total_accepted_draft_tokens for _, s, _ in results) / proposed
    assert proposed >= n and 0.15 < rate < 0.95, (proposed, rate)
    assert_follows(counts, small_pair[0], small_pair[1], params)


def test_a_failing_colocated_draft_costs_proposals_never_output(pair_dir):
    alone = target_alone(pair_dir, prompts())
    target, _ = colocated(pair_dir)
    calls = iter(range(10**6))
    fail_drafters(target, lambda: RuntimeError("injected") if next(calls) % 3 == 0 else None)
    rounds = []
    got = generate(target, None, [Request(p, MAX_TOKENS, 3) for p in prompts()],
                   on_round=rounds.append)
    assert [r[0] for r in got] == alone
    assert sum(r.in_target_failure == "error" for r in rounds) > 3
    assert sum(r.accepted for r in rounds) > 0


def test_the_draft_catches_up_after_rounds_it_did_not_draft(pair_dir):
    """Hybrid rounds drafted by lookup still commit tokens the co-located draft must feed: its
    history follows every verification, not only its own."""
    from specdec.proposers.ngram import NgramProposer
    reqs = [Request(p + p, MAX_TOKENS, 8, auto=True, proposer=Proposer.HYBRID)
            for p in prompts()]
    alone = target_alone(pair_dir, [r.prompt for r in reqs])
    target, _ = colocated(pair_dir)
    rounds = []
    planner = Planner(8, proposers=(Proposer.NGRAM, DRAFT), in_target=IN_TARGET + (DRAFT,))
    got = generate(target, None, reqs, planner=planner, ngram=NgramProposer(),
                   on_round=rounds.append)
    assert [r[0] for r in got] == alone
    used = {r.proposer for r in rounds if r.k}
    assert {Proposer.NGRAM, DRAFT} <= used, used
    # What it drafted a round ahead for a round that a lookup won is counted as discarded
    # (specdec_discarded_draft_tokens_total).
    assert all(r.ahead == DRAFT and r.discarded >= 0 for r in rounds)
    assert any(r.proposer == Proposer.NGRAM and r.k and r.discarded for r in rounds)
    assert torch.is_grad_enabled()   # the engine's inference mode stayed inside it


def test_a_verdict_says_what_the_draft_caught_up_on(pair_dir):
    """A draft that sat out rounds reads every token committed since before it drafts: its
    proposal cost a prefill, and the policy must not fit a draft step's cost on it
    (Planner.observe skips a round whose draft_fed is more than two)."""
    from specdec.records import VerifyCall
    target, _ = colocated(pair_dir)
    prompt, greedy = prompts()[0], SamplingParams()
    target.pool.open(1, 0)

    def verify(start, tokens, drafts, next_k):
        return target.verify([VerifyCall(1, start, tokens, drafts, None, greedy, next_k,
                                         bool(drafts), DRAFT)])[0]

    v = verify(0, prompt, [], 0)   # the prefill; the draft sits out two rounds
    committed = prompt + v.tokens
    v = verify(len(prompt), v.tokens, [], 0)
    assert v.fed == 0 and not v.proposal
    committed += v.tokens
    v = verify(len(committed) - 1, v.tokens, [], 2)
    committed += v.tokens
    assert len(v.proposal) == 2 and v.fed == len(committed)   # it read the whole sequence
    v = verify(len(committed) - 1, v.tokens, v.proposal, 2)
    assert len(v.proposal) == 2 and 1 <= v.fed <= 2 + 1        # its own drafts, as accepted
