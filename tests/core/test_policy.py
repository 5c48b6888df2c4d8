"""specdec.planning.policy: k per round from acceptance and cost, probes, frozen mode
(test_planner.py: the draft's health, load levels, the load cap; test_policy_at_load.py: rows
batched).

Rounds are simulated: acceptance is drawn with a known per-token probability and each round is
priced by a known cost model, so the policy's throughput can be compared with the best fixed k.
"""
import random

import pytest

from specdec.planning.estimates import Costs, LinearFit, PriorCosts, expected_tokens
from specdec.planning.planner import Planner
from specdec.planning.estimates import best_k
from specdec.planning.policy import Choice
from specdec.records import Round

DRAFT_CALL, DRAFT_TOKEN, VERIFY_CALL, VERIFY_TOKEN, OTHER = 0.002, 0.0006, 0.005, 0.0003, 0.0005


def cost(k: int) -> tuple[float, float]:
    return (DRAFT_CALL + DRAFT_TOKEN * k if k else 0.0), VERIFY_CALL + VERIFY_TOKEN * k


def play(policy, accept, rounds: int, rng: random.Random, limit: int = 8):
    """Run rounds; accept(i) is the per-token acceptance at round i. Returns (ks, tokens/s)."""
    ks, tokens, seconds = [], 0, 0.0
    for i in range(rounds):
        c = policy.choose(limit)
        m = 0
        while m < c.k and rng.random() < accept(i):
            m += 1
        d, v = cost(c.k)
        policy.observe(Round(c.k, m, d, v, OTHER, False, 1 if c.k else 0, None, limit, c.reason))
        ks.append(c.k)
        tokens += m + 1
        seconds += d + v + OTHER
    return ks, tokens / seconds


def fixed_rate(a: float, k: int) -> float:
    d, v = cost(k)
    return expected_tokens([a] * k)[-1] / (d + v + OTHER)


def test_expected_tokens_is_leviathans_formula_for_equal_acceptance():
    for a in (0.1, 0.5, 0.9):
        for k in range(6):
            assert expected_tokens([a] * k)[k] == pytest.approx((1 - a ** (k + 1)) / (1 - a))
    assert expected_tokens([1.0, 0.5, 0.0]) == [1.0, 2.0, 2.5, 2.5]


def test_linear_fit_recovers_a_line_and_keeps_the_prior_shape_without_spread():
    fit = LinearFit(prior=(1.0, 1.0))
    rng = random.Random(0)
    for _ in range(400):
        x = rng.randint(0, 8)
        fit.add(x, 0.004 + 0.0007 * x + rng.gauss(0, 1e-5))
    a, b = fit.coef
    assert a == pytest.approx(0.004, rel=0.05) and b == pytest.approx(0.0007, rel=0.05)
    one_x = LinearFit(prior=(2.0, 1.0))        # only x = 4 seen: the prior's 2:1 shape, scaled
    assert one_x(4) == 6.0                     # read (and kept) before any data
    for _ in range(50):
        one_x.add(4, 0.012)
    assert one_x(4) == pytest.approx(0.012) and one_x.coef[0] == pytest.approx(2 * one_x.coef[1])
    one_x.add(0, 0.0)                          # every observation moves the fit it gives
    assert one_x(4) < 0.012


def test_best_k_follows_acceptance_and_cost():
    costs = Costs.prior(PriorCosts(DRAFT_CALL, DRAFT_TOKEN, VERIFY_CALL, VERIFY_TOKEN, OTHER))
    assert best_k([0.02] * 8, costs) == 0
    assert best_k([0.95] * 8, costs) == 8
    expensive = Costs.prior(PriorCosts(0.001, 0.02, 0.005, 0.0003, 0.0))
    assert best_k([0.95] * 8, expensive) == 0          # a draft step costs 4 verifications
    assert 0 < best_k([0.9, 0.9, 0.1, 0.1, 0.1], costs) <= 2   # acceptance falls at position 3


def test_a_poor_draft_is_turned_off_and_probed_ever_more_rarely():
    planner = Planner(8)
    rng = random.Random(1)
    ks, rate = play(planner.open(8, auto=True), lambda i: 0.02, 400, rng)
    assert rate >= 0.95 * fixed_rate(0.02, 0)
    assert sum(k > 0 for k in ks) <= 20
    probes = [i for i, k in enumerate(ks) if k]
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps[-1] > gaps[0] and max(gaps) <= 64 + 1
    # A new sequence starts from what the server has seen: off from its first round, and its
    # first probe waits the longer the rarer the server's drafts were accepted.
    ks2, _ = play(planner.open(8, auto=True), lambda i: 0.02, 64, rng)
    assert ks2[:32] == [0] * 32


def test_a_good_draft_runs_near_the_best_fixed_k():
    planner = Planner(8)
    best = max(fixed_rate(0.85, k) for k in range(9))
    _, rate = play(planner.open(8, auto=True), lambda i: 0.85, 600, random.Random(2))
    assert rate >= 0.95 * best


def test_a_fresh_server_grows_k_past_where_its_prior_starts():
    # The prior (0.6 per position) starts k low; positions not yet drafted are assumed to accept
    # like the last drafted one, so a draft accepted 90 % of the time reaches the best k
    # within a few requests' worth of rounds instead of staying where it began.
    planner = Planner(8)
    best = max(range(9), key=lambda k: fixed_rate(0.9, k))
    ks, _ = play(planner.open(8, auto=True), lambda i: 0.9, 60, random.Random(4))
    assert ks[0] < best and sum(k >= best - 1 for k in ks[30:]) >= 25
    assert Planner(8).server_acceptance("draft") == [0.6] * 8


def test_probes_give_speculation_back_when_the_text_becomes_predictable():
    planner = Planner(8)
    ks, _ = play(planner.open(8, auto=True), lambda i: 0.0 if i < 150 else 0.95, 300,
                 random.Random(3))
    assert sum(ks[100:150]) <= 5
    assert sum(k >= 4 for k in ks[250:]) >= 45


def test_the_measured_costs_replace_the_prior():
    planner = Planner(8, prior=PriorCosts(0.1, 0.1, 0.001, 0.0, 0.0))  # prior: draft hopeless
    policy = planner.open(8, auto=False)
    play(policy, lambda i: 0.9, 50, random.Random(4), limit=4)      # fixed k = 4 measures
    e = planner.estimates()
    assert e.costs["verify_call"] == pytest.approx(VERIFY_CALL + 4 * VERIFY_TOKEN, rel=0.2)
    assert e.costs["draft_call"] + 4 * e.costs["draft_token"] == pytest.approx(
        DRAFT_CALL + 4 * DRAFT_TOKEN, rel=0.01)
    assert planner.open(8, auto=True).choose(8).k > 0


def test_frozen_choices_depend_only_on_the_sequences_own_rounds():
    """A seeded sampling request's k must not depend on load, timing or other requests."""
    seasoned = Planner(8)
    play(seasoned.open(8, auto=True), lambda i: 0.1, 300, random.Random(5))
    seasoned.active = 12
    fresh = Planner(8)
    outcomes = random.Random(6)
    script = [outcomes.randint(0, 8) for _ in range(200)]
    choices = []
    for planner in (seasoned, fresh):
        policy, ks = planner.open(8, auto=True, frozen=True), []
        for m in script:
            k = policy.choose(8).k
            policy.observe(Round(k, min(m, k), 1.0, 7.0, 3.0, False, 1, None, 8, ""))
            ks.append(k)
        choices.append(ks)
    assert choices[0] == choices[1]
    assert len(set(choices[0])) > 2          # and it does adapt


def test_fixed_k_with_hybrid_takes_a_lookup_match_else_the_draft():
    planner = Planner(8)
    hybrid = planner.open(4, auto=False, proposers=("ngram", "draft"))
    assert hybrid.choose(4, {"ngram": 3, "draft": 4}) == Choice(3, None, "ngram")
    assert hybrid.choose(4, {"ngram": 0, "draft": 4}) == Choice(4, None, "draft")
    # A sequence without the draft (a server that has none): only what it offers is chosen.
    assert hybrid.choose(4, {"ngram": 0}) == Choice(0, "no_match", "ngram")
    assert hybrid.choose(4, {"draft": 4}) == Choice(4, None, "draft")
    lookup_only = planner.open(4, auto=False, proposers=("ngram",))
    assert lookup_only.choose(4, {"ngram": 0}) == Choice(0, "no_match", "ngram")


def play_hybrid(policy, accept, offer, rounds, rng):
    """accept: proposer -> per-token acceptance; offer(i): tokens a lookup has at round i."""
    used = []
    for i in range(rounds):
        c = policy.choose(8, {"ngram": offer(i), "draft": 8})
        m = 0
        while m < c.k and rng.random() < accept[c.proposer]:
            m += 1
        d = cost(c.k)[0] if c.proposer == "draft" else 0.00002
        policy.observe(Round(c.k, m, d if c.k else 0.0, cost(c.k)[1], OTHER, False,
                             1 if c.k else 0, None, 8, c.reason, c.proposer))
        used.append((c.proposer if c.k else None, c.k))
    return used


def test_auto_hybrid_follows_each_proposers_acceptance():
    rng = random.Random(7)
    # Copying text: lookups are right, the draft is mediocre: lookups whenever offered.
    used = play_hybrid(Planner(8).open(8, auto=True, proposers=("ngram", "draft")),
                       {"ngram": 0.95, "draft": 0.5}, lambda i: 6 if i % 3 else 0, 300, rng)
    offered = [u for i, u in enumerate(used) if i % 3 and i > 30]
    assert sum(p == "ngram" for p, _ in offered) > 0.8 * len(offered)
    assert all(p == "draft" for i, (p, k) in enumerate(used) if i % 3 == 0 and k)
    # Free text: lookups match by chance and are wrong; the draft carries.
    used = play_hybrid(Planner(8).open(8, auto=True, proposers=("ngram", "draft")),
                       {"ngram": 0.05, "draft": 0.8}, lambda i: 3, 300, rng)
    late = used[50:]
    assert sum(p == "draft" for p, _ in late) > 0.85 * len(late)
    # Rarely, if at all: a lookup measured off is probed now and then, but one whose estimate
    # still pays is not (it is beaten, and measured where it wins), so which of the two it is
    # late depends on the random early rounds (the probe test is below).
    assert sum(p == "ngram" for p, _ in late) < 0.1 * len(late)


def test_an_off_proposers_probes_keep_within_their_share_of_a_batchs_time():
    """Every row probes on its own, and a probe widens its whole batch's round by the
    proposer's step: a dear step (SWIFT's, 0.95 of a verification here) is probed so rarely
    that the batch spends at most about PROBE_SHARE on probes; a cheap one (a head's) as
    often as the backoff allows. 16 rows, each drafting only to probe."""
    from specdec.planning.policy import PROBE_SHARE

    def probing_rounds(proposer: str, step_s: float, rows: int, rounds: int = 600) -> float:
        prior = PriorCosts(verify_call=0.008, verify_token=0.0, other=0.0, eagle_call=0.0,
                           eagle_token=step_s, self_token=step_s)
        planner = Planner(8, prior=prior, proposers=(proposer,), in_target=(proposer,))
        policies = [planner.open(8, auto=True, proposers=(proposer,)) for _ in range(rows)]
        for pol in policies:
            for _ in range(50):   # each learns it never pays: off
                pol.observe(Round(1, 0, step_s, 0.008, 0.0, False, 0, None, 8, None, proposer))
        batches = 0
        for _ in range(rounds):
            ks = [pol.choose(8, {proposer: pol.lookahead(8)}).k for pol in policies]
            batches += any(ks)
        return batches / rounds

    dear = probing_rounds("self", 0.0076, 16)
    assert 0 < dear * 0.95 <= 1.5 * PROBE_SHARE, dear
    cheap = probing_rounds("eagle", 0.0002, 16)   # its step 2.5 % of a verification
    assert cheap > 4 * dear, (cheap, dear)


def test_a_probe_that_catches_up_on_the_sequence_is_spaced_by_what_it_took():
    """SWIFT off follows nothing, so its probe first re-reads every token since it was last
    used, which the cost model's one-token step leaves out: the probes are spaced by what they
    took, within the batch's share; by the step alone they spent over three times it."""
    from specdec.planning.policy import PROBE_SHARE

    def probes(probe_s: float, rounds: int = 2000) -> int:
        prior = PriorCosts(verify_call=0.008, verify_token=0.0, other=0.0, self_token=0.0076)
        planner = Planner(8, prior=prior, proposers=("self",), in_target=("self",))
        pol = planner.open(8, auto=True, proposers=("self",))
        for _ in range(50):   # it never pays: off
            pol.observe(Round(1, 0, 0.0076, 0.008, 0.0, False, 0, None, 8, None, "self"))
        n = 0
        for _ in range(rounds):
            c = pol.choose(8, {"self": pol.lookahead(8)})
            n += c.k > 0
            pol.observe(Round(c.k, 0, probe_s if c.k else 0.0, 0.008, 0.0, False, 1, None, 8,
                              c.reason, "self"))
        return n

    share = 1.5 * PROBE_SHARE * 2000 * 0.008   # seconds of probes the share allows, and some
    one_step = probes(0.0076)
    catching_up = probes(0.05)   # six verifications' time
    assert 0 < catching_up * 0.05 <= share < one_step * 0.05, (one_step, catching_up)


def test_an_off_draft_model_a_tenth_of_a_verification_drafts_only_to_probe():
    """A 1B draft in an 8B target's process on an H200 at 16 rows: its step 0.12 of a
    verification, measured only in probes of one token (so the fit puts a share of it in the
    call's fixed cost). Drafted every round while off, ready to probe, that step would cost
    every round about a tenth (0.64 of target-only served, 2026-11-27): it drafts only for the
    rounds that probe, and those stay within PROBE_SHARE of the batch's time."""
    from specdec.planning.policy import PROBE_SHARE
    verify_s, step_s, rows = 0.010, 0.0012, 16
    planner = Planner(8, proposers=("draft",), in_target=("draft",))
    policies = [planner.open(8, auto=True, proposers=("draft",)) for _ in range(rows)]
    for pol in policies:
        for _ in range(50):   # each learns it never pays: off
            pol.observe(Round(1, 0, step_s, verify_s, 0.0, False, 1, None, 8, None, "draft", 1))
    drafting = 0
    for _ in range(600):
        ks = [pol.lookahead(8) for pol in policies]
        drafting += max(ks) > 0
        for pol in policies:
            pol.choose(8, {"draft": 0})
    assert drafting * step_s <= 1.5 * PROBE_SHARE * 600 * verify_s, drafting


def test_a_proposer_that_pays_is_not_probed_where_another_wins():
    """Copying prose: long runs of rounds with a lookup match, the draft model in between. The
    draft pays where it is chosen, so a round where the lookup wins is not spent on a one-token
    probe of the draft (a BLS call for less than the lookup offers): the served hybrid auto was
    0.875x of its best fixed K on out-of-domain prose at 1 stream with such probes, 0.96-1.0x
    without."""
    rng = random.Random(5)
    used = play_hybrid(Planner(8).open(8, auto=True, proposers=("ngram", "draft")),
                       {"ngram": 0.95, "draft": 0.85}, lambda i: 3 if i % 25 < 20 else 0, 400,
                       rng)
    matched = [u for i, u in enumerate(used) if i % 25 < 20 and i > 50]
    assert all(p == "ngram" for p, _ in matched), [u for u in matched if u[0] != "ngram"]
    assert all(p == "draft" and k > 1 for i, (p, k) in enumerate(used) if i % 25 >= 20 and
               i > 50)


def test_a_heads_catch_up_is_no_cost_of_drafting():
    """A sequence that uses the head pays its catch-up on every verification, k = 0 included:
    only the head's steps weigh against what they draft."""
    costs = Costs.prior(PriorCosts(eagle_call=0.004, eagle_token=0.001))
    for k in (1, 4):
        assert costs.round_s("eagle", k) == pytest.approx(
            0.001 * k + costs.verify(k) + costs.other(0))
        assert costs.round_s("draft", k) == pytest.approx(
            costs.propose_s("draft", k) + costs.verify(k) + costs.other(0))
    assert costs.round_s("eagle", 0) == costs.round_s(None, 0)


@pytest.mark.parametrize("frozen", [True, False])
def test_a_choice_of_no_drafts_is_held_a_few_rounds_and_probes_when_it_would(frozen,
                                                                             monkeypatch):
    """An off proposer is not weighed again every round (choosing is Python, a row's every
    round): the choice of no drafts holds HOLD_ROUNDS rounds. A frozen policy reads nothing
    that changes meanwhile, so it chooses exactly as if it weighed every round; a live one
    probes as rarely and stays as fast."""
    import specdec.planning.policy as policy_module
    hold = policy_module.HOLD_ROUNDS

    def run(hold: int) -> tuple[list[int], float, int]:
        monkeypatch.setattr(policy_module, "HOLD_ROUNDS", hold)
        weighed = [0]
        real = policy_module.best

        def counted(*args):
            weighed[0] += 1
            return real(*args)
        monkeypatch.setattr(policy_module, "best", counted)
        planner = Planner(8)
        ks, rate = play(planner.open(8, auto=True, frozen=frozen), lambda i: 0.02, 600,
                        random.Random(7))
        monkeypatch.setattr(policy_module, "best", real)
        return ks, rate, weighed[0]

    every_round, rate, weighed = run(0)
    held, held_rate, held_weighed = run(hold)
    assert hold >= 4
    assert held_weighed < weighed / 3                  # weighed a third as often, or less
    probes = sum(k > 0 for k in held)
    assert 0 < probes <= 20                            # it still probes, as rarely
    if frozen:
        assert held == every_round
    else:
        assert abs(probes - sum(k > 0 for k in every_round)) <= 3
        assert held_rate >= 0.97 * fixed_rate(0.02, 0) and held_rate >= 0.99 * rate


def test_a_held_choice_is_left_when_a_lookup_finds_a_match():
    planner = Planner(8)
    policy = planner.open(8, auto=True, proposers=("ngram", "draft"))
    for _ in range(40):   # the draft never pays: off
        policy.observe(Round(1, 0, 0.05, 0.005, 0.0005, False, 1, None, 8, None, "draft"))
    assert policy.choose(8, {"draft": 8, "ngram": 0}).k == 0 and policy.held is not None
    c = policy.choose(8, {"draft": 8, "ngram": 5})
    assert c.k > 0 and c.proposer == "ngram" and policy.held is None


def test_a_rounds_cost_line_is_round_s_at_every_k():
    planner = Planner(8, in_target=("eagle", "self"))
    policy = planner.open(8, auto=True)
    play(policy, lambda i: 0.7, 80, random.Random(8))
    for costs in (planner.costs_now(), planner.frozen_costs, Costs.prior(PriorCosts())):
        for p in ("draft", "ngram", "eagle", "self", "medusa"):
            t0, a, b = costs.round_line(p)
            assert t0 == pytest.approx(costs.round_s(p, 0), rel=1e-12)
            for k in range(1, 9):
                assert a + b * k == pytest.approx(costs.round_s(p, k), rel=1e-12)


def test_heads_never_chosen_learn_their_cost_from_unused_drafts_and_idle_while_off():
    """Medusa's heads off (their drafts never accepted) drafted a token every round, ready to
    probe, at the prior's cost, learned only where chosen: where they weigh as much as the
    target (the CPU's default pair) that was 0.85x of target-only, never drafting. What unused
    drafts took is learned too, and heads that cost their whole call draft only for probes."""
    verify_s, heads_s = 0.004, 0.003
    planner = Planner(8, proposers=("medusa",), in_target=("medusa",))
    policy = planner.open(8, auto=True, proposers=("medusa",))
    for _ in range(30):   # drafted a round ahead, never chosen
        policy.observe(Round(k=0, accepted=0, draft_s=0.0, verify_s=verify_s, limit=8,
                             proposer="medusa", discarded=1, ahead="medusa", ahead_s=heads_s))
    assert planner.costs_now().propose_s("medusa", 1) == pytest.approx(heads_s, rel=0.05)
    for _ in range(30):   # its drafts are never accepted: off
        policy.observe(Round(k=1, accepted=0, draft_s=heads_s, verify_s=verify_s,
                             proposer="medusa", drafted=1))
    pending, drafting = 0, []
    for _ in range(200):
        c = policy.choose(8, {"medusa": pending})
        unused = pending - c.k
        policy.observe(Round(k=c.k, accepted=0, draft_s=heads_s if c.k else 0.0,
                             verify_s=verify_s, limit=8, reason=c.reason, proposer="medusa",
                             drafted=c.k, discarded=unused, ahead="medusa",
                             ahead_s=heads_s if unused and not c.k else None))
        pending = policy.lookahead(8)
        drafting.append(pending > 0)
    assert 0 < sum(drafting) <= 20, sum(drafting)    # only for its probes


def test_medusa_heads_cost_their_whole_call_when_asked_and_nothing_when_not():
    """A head's catch-up is paid drafting or not, so only its steps are a choice's; Medusa's
    heads run once for all the tokens asked and not at all for none: their whole call is."""
    planner = Planner(8, in_target=("eagle", "medusa"))
    costs = planner.costs_now()
    for _ in range(40):
        costs.propose["medusa"].add(1, 0.003)
        costs.propose["medusa"].add(4, 0.0031)
        costs.propose["eagle"].add(1, 0.003)
        costs.propose["eagle"].add(4, 0.0031)
        costs.verify.add(0, 0.004)
        costs.verify.add(4, 0.0042)
    plain = costs.round_s(None, 0)
    assert costs.round_s("medusa", 1) - plain == pytest.approx(0.003 + 0.00005, rel=0.02)
    assert costs.round_s("eagle", 1) - plain < 0.0002
