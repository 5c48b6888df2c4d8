"""specdec.planning.policy at load: rows verified together, each paying for the batch's widest row,
with the draft model, an EAGLE-3 head drafting inside the verification, lookups, and both kinds
mixed (hybrid). As in test_policy.py, rounds are simulated: acceptance drawn with a known per-token
probability, each batch priced by a known cost model, and the policy's throughput compared with the
best fixed k."""
import random

from specdec.planning.planner import Planner
from specdec.records import Round

DRAFT_CALL, DRAFT_TOKEN, OTHER = 0.002, 0.0006, 0.0005   # test_policy.py's cost model


# At load a batched verification is compute-bound: each token of the widest row costs a fifth of
# the call (on one sequence a tenth of a millisecond against five).
BATCH_CALL, BATCH_TOKEN = 0.010, 0.002


def play_batched(planner, rows: int, accept: float, rounds: int, rng,
                 fixed: int | None = None) -> float:
    """`rows` sequences verified together every round, as a server at load batches them: the
    batch costs what its widest row asks (BATCH_CALL + BATCH_TOKEN x the most drafts) and every
    row waits for it; rounds report that width (loop.Round.batch_k). Returns committed tokens
    per second over all rows."""
    policies = [planner.open(8, auto=True) if fixed is None else
                planner.open(fixed, auto=False) for _ in range(rows)]
    tokens, seconds = 0, 0.0
    for _ in range(rounds):
        choices = [p.choose(8) for p in policies]
        widest = max(c.k for c in choices)
        verify = BATCH_CALL + BATCH_TOKEN * widest
        for p, c in zip(policies, choices):
            m = 0
            while m < c.k and rng.random() < accept:
                m += 1
            p.observe(Round(c.k, m, (DRAFT_CALL + DRAFT_TOKEN * c.k) if c.k else 0.0, verify,
                            OTHER, False, 1 if c.k else 0, None, 8, c.reason, batch_k=widest))
            tokens += m + 1
        seconds += verify + OTHER + (DRAFT_CALL + DRAFT_TOKEN * widest if widest else 0.0)
    return tokens / seconds


def test_at_load_rows_choose_alike_from_the_batchs_costs():
    """A batch costs what its widest row drafts: fitted on a row's own k the verification hardly
    grows (the others keep the batch wide) and a row whose own estimate runs high widens every
    row's round. Costs fitted on the batch's width, and rows that weigh the server's estimate
    more as they share the batch, keep auto within 5 % of the best fixed k (0.99x; the policy
    before both: 0.87x)."""
    rates = {k: play_batched(Planner(8), 16, 0.7, 150, random.Random(k), fixed=k)
             for k in range(1, 9)}
    auto = play_batched(Planner(8), 16, 0.7, 300, random.Random(11))
    assert auto >= 0.95 * max(rates.values()), (auto, rates)


# The head's steps run over the whole batch, one after another: each costs about a seventh of a
# batched verification's fixed part (a one-layer head and its LM head against the target).
HEAD_STEP = 0.0015


def play_head(planner, accepts: list[float], rounds: int, rng,
              fixed: int | None = None) -> tuple[float, float]:
    """A sequence a row, accepts[i] row i's acceptance a token, drafting with an EAGLE-3 head,
    verified together: each verification also runs the head for the next round as many steps
    as the most any row asks ahead (Policy.lookahead), and a row's round can take at most what
    was drafted for it. Returns committed tokens per second over all rows, and the batch's mean
    width."""
    policies = [planner.open(8, auto=True, proposers=("eagle",)) if fixed is None else
                planner.open(fixed, auto=False, proposers=("eagle",)) for _ in accepts]
    pending = [0] * len(accepts)   # the head's proposal for each row, in tokens
    steps, head_s = 0, 0.0         # the steps that drafted them, and their seconds
    tokens, seconds, widths = 0, 0.0, 0
    for _ in range(rounds):
        choices = [p.choose(8, {"eagle": n}) for p, n in zip(policies, pending)]
        widest = max(c.k for c in choices)
        ahead = [p.lookahead(8) for p in policies]
        verify = BATCH_CALL + BATCH_TOKEN * widest
        for p, c, accept in zip(policies, choices, accepts):
            m = 0
            while m < c.k and rng.random() < accept:
                m += 1
            p.observe(Round(c.k, m, head_s if c.k else 0.0, verify, OTHER, False, 0, None, 8,
                            c.reason, "eagle", steps if c.k else 0, batch_k=widest))
            tokens += m + 1
        pending, steps = ahead, max(ahead)
        head_s = HEAD_STEP * steps
        seconds += verify + head_s + OTHER
        widths += widest
    return tokens / seconds, widths / rounds


def test_the_head_drafts_ahead_only_what_the_next_round_takes():
    """The head drafts a round ahead, inside the verification, as many steps as the batch's
    most eager row asks. Drafting one past the estimates' best every round (for the one round
    in STRETCH_EVERY that stretches k) made every round pay a head step it rarely used: auto
    0.92x of the best fixed k at 16 rows, 0.93x alone; 0.98x both, now that the extra step is
    drafted only before a round that stretches."""
    rates = {k: play_head(Planner(8), [0.7] * 16, 150, random.Random(k), fixed=k)[0]
             for k in range(1, 9)}
    auto = play_head(Planner(8), [0.7] * 16, 300, random.Random(11))[0]
    assert auto >= 0.95 * max(rates.values()), (auto, rates)
    one = {k: play_head(Planner(8), [0.7], 400, random.Random(k), fixed=k)[0] for k in range(1, 9)}
    alone = play_head(Planner(8), [0.7], 800, random.Random(11))[0]
    assert alone >= 0.95 * max(one.values()), (alone, one)


def test_at_load_rows_of_unlike_texts_draft_one_width():
    """Rows whose texts accept from 0.4 to 0.95 a token, batched: each row choosing from its
    own estimate put the batch at its most confident row's k (3.8 wide for a best fixed k of
    2) while most rows drafted less, 0.87x of the best fixed k. Every row taking the batch's
    width from the server's estimate: 0.98x."""
    accepts = [0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.6] * 2
    rates = {k: play_head(Planner(8), accepts, 150, random.Random(k + 11), fixed=k)[0]
             for k in range(1, 9)}
    auto, width = play_head(Planner(8), accepts, 300, random.Random(11))
    assert auto >= 0.95 * max(rates.values()), (auto, width, rates)


def play_mixed(planner, rows: int, rounds: int, rng, fixed: int | None = None) -> float:
    """Hybrid rows batched: a lookup match in 60 % of a row's rounds (mostly 2 or 3 tokens long,
    a fifth of them 8), right at 0.92 a token, else the draft model at 0.6. The batch costs what
    its widest row asks (BATCH_CALL + BATCH_TOKEN x the most drafts, plus one draft-model call as
    wide as its widest draft). Returns committed tokens per second over all rows."""
    policies = [planner.open(8, auto=True, proposers=("ngram", "draft")) if fixed is None else
                planner.open(fixed, auto=False, proposers=("ngram", "draft"))
                for _ in range(rows)]
    tokens, seconds = 0, 0.0
    for _ in range(rounds):
        offers = [rng.choice((2, 2, 2, 3, 8)) if rng.random() < 0.6 else 0 for _ in policies]
        choices = [p.choose(8, {"ngram": n, "draft": 8}) for p, n in zip(policies, offers)]
        widest = max(c.k for c in choices)
        drafted = max([c.k for c in choices if c.proposer == "draft"] or [0])
        verify = BATCH_CALL + BATCH_TOKEN * widest
        draft = DRAFT_CALL + DRAFT_TOKEN * drafted if drafted else 0.0
        for p, c in zip(policies, choices):
            m = 0
            while m < c.k and rng.random() < (0.92 if c.proposer == "ngram" else 0.6):
                m += 1
            own = (draft if c.proposer == "draft" else 0.00002) if c.k else 0.0
            p.observe(Round(c.k, m, own, verify, OTHER, False, 1 if c.k else 0, None, 8,
                            c.reason, c.proposer, drafted if c.proposer == "draft" else 0,
                            batch_k=widest))
            tokens += m + 1
        seconds += verify + draft + OTHER
    return tokens / seconds


def test_at_load_a_row_drafts_little_more_than_the_batchs_typical_row():
    """A row whose lookup matched 8 tokens it trusts would widen every row's verification for
    its own gain: nearly every round some row of 16 has such a match, and the batch paid for 8
    drafts where the others asked for 2 or 3 (auto 0.77x of the best fixed K here; 0.88-0.94x
    served, docs/benchmarks.md). Capped at one past the rows' mean k: 0.91x; at one past the
    batch's width for the draft: 0.96x. A single sequence has no one to slow and keeps its own
    choice."""
    rates = {k: play_mixed(Planner(8), 16, 300, random.Random(k), fixed=k) for k in (2, 3, 4, 8)}
    auto = play_mixed(Planner(8), 16, 600, random.Random(11))
    assert auto >= 0.93 * max(rates.values()), (auto, rates)
    alone = {k: play_mixed(Planner(8), 1, 1500, random.Random(k), fixed=k) for k in (2, 3, 4, 8)}
    assert play_mixed(Planner(8), 1, 3000, random.Random(11)) >= max(alone.values())



# The H200's measured 8B costs (benchmarks/sim/h200-8b-measured.json): a verification of 4 rows
# 9.3 ms and nearly flat in its width, of 16 rows 11.7 ms plus 0.17 a token of width; the head's
# step over the batch about 0.5 and 0.7 ms. (call s, s a token of width, s a head step)
H200 = {4: (0.0093, 0.00007, 0.0005), 16: (0.0117, 0.00017, 0.0007)}


def play_hybrid_head(planner, rows: int, rounds: int, rng, costs: tuple[float, float, float],
                     fixed: int | None = None) -> tuple[float, float]:
    """Hybrid rows with an EAGLE-3 head, batched: a lookup match in 60 % of a row's rounds
    (lengths as play_mixed's), right at 0.92 a token, else the head at 0.7, which drafts a
    round ahead inside the verification as in play_head (a lookup taken leaves its proposal
    unused: Round.discarded). costs: the verification's call and token, the head's step.
    Returns committed tokens per second over all rows, and tokens a row's round."""
    call, token, step = costs
    policies = [planner.open(8, auto=True, proposers=("ngram", "eagle")) if fixed is None else
                planner.open(fixed, auto=False, proposers=("ngram", "eagle"))
                for _ in range(rows)]
    pending = [0] * rows           # the head's proposal for each row, in tokens
    steps, head_s = 0, 0.0         # the steps that drafted them, and their seconds
    tokens, seconds = 0, 0.0
    for _ in range(rounds):
        offers = [rng.choice((2, 2, 2, 3, 8)) if rng.random() < 0.6 else 0 for _ in policies]
        choices = [p.choose(8, {"ngram": n, "eagle": e})
                   for p, n, e in zip(policies, offers, pending)]
        widest = max(c.k for c in choices)
        ahead = [p.lookahead(8) for p in policies]
        verify = call + token * widest
        for p, c, e in zip(policies, choices, pending):
            head = c.proposer == "eagle"
            m = 0
            while m < c.k and rng.random() < (0.7 if head else 0.92):
                m += 1
            own = (head_s if head else 0.00002) if c.k else 0.0
            p.observe(Round(c.k, m, own, verify, OTHER, False, 0 if head else int(bool(c.k)),
                            None, 8, c.reason, c.proposer or "eagle",
                            steps if head and c.k else 0, batch_k=widest,
                            discarded=max(0, e - (c.k if head else 0)), ahead="eagle"))
            tokens += m + 1
        pending, steps = ahead, max(ahead)
        head_s = step * steps
        seconds += verify + head_s + OTHER
    return tokens / seconds, tokens / (rounds * rows)


def test_at_load_hybrid_with_a_head_runs_at_the_best_fixed_k():
    """Hybrid, the default where a head is served, batched at the H200's costs: auto 1.03-1.04x
    of the best fixed k at 4 rows, 1.01-1.02x at 16 (seeds 11-13). A lookup reaches one past
    the head's width (Adaptive._width), so the width bounds a long match. The narrowest width
    within 3 % of the best (tried 2026-11-27, docs/benchmarks.md) took fewer tokens a round here
    too (3.27-3.48 -> 2.96-3.19 at 4 rows) but within 2 % of this throughput, where served it
    lost 8.5 %: this guards hybrid at load, it does not model that loss."""
    for rows, costs in H200.items():
        best = max(play_hybrid_head(Planner(8), rows, 200, random.Random(k), costs, fixed=k)[0]
                   for k in range(1, 9))
        auto = play_hybrid_head(Planner(8), rows, 400, random.Random(11), costs)[0]
        assert auto >= 0.98 * best, (rows, auto, best)
