"""Sampling: speculative outputs follow the target's distribution (a chi-square test).

The models have a 5-token vocabulary, so every 3-token continuation (125 of them) has an exact
probability under the target, computed independently with transformers. A negative control runs
the same test against the draft's distribution and must reject it: the test has power.

Deterministic proposals (n-gram lookup, a greedy draft beside a sampling target) are verified as
one-hot q: accepted with probability p(d), corrected from p without d. Their prompts repeat, so
lookup proposes, and were picked so the random target agrees with the proposals a third to a
half of the time (a greedy draft: a fifth): neither the accept nor the reject path is idle.
"""
import functools
import itertools

import pytest
import torch
import transformers
from scipy.stats import chisquare

from specdec.planning.estimates import PriorCosts
from specdec.decoding.local import LocalDrafter
from specdec.proposers.ngram import NgramProposer
from specdec.planning.planner import Planner
from specdec.records import ProposeCall, Request
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines, generate

V, LENGTH, N = 5, 3, 4000
PROMPT = [1, 3, 0, 2]


class AcceptanceOnly(Planner):
    """The policy with its costs fixed (a cheap draft), so which k it chooses depends on the
    acceptance it has seen, never on how long this machine's rounds took."""

    def __init__(self, max_k):
        super().__init__(max_k, prior=PriorCosts(draft_call=0.0002, draft_token=0.0001))

    def costs_now(self):
        return self.frozen_costs


def exact_distribution(path, params: SamplingParams, prompt=PROMPT,
                       length=LENGTH) -> dict[tuple, float]:
    """P(x1 .. x_length | prompt) under the model with HF's own temperature/top-k/top-p
    warpers."""
    return _exact_distribution(path, params, tuple(prompt), length)


@functools.cache   # the same references recur across parametrizations and modules
def _exact_distribution(path, params: SamplingParams, prompt: tuple[int, ...],
                        length: int) -> dict[tuple, float]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    warpers = [transformers.TemperatureLogitsWarper(params.temperature)]
    if params.top_k:
        warpers.append(transformers.TopKLogitsWarper(params.top_k))
    if params.top_p < 1:
        warpers.append(transformers.TopPLogitsWarper(params.top_p))
    # Every continuation in one batch: V**length rows, each warped row by row as in a loop.
    seqs = list(itertools.product(range(V), repeat=length))
    ids = torch.tensor([list(prompt) + list(seq) for seq in seqs])   # [V**length, P + length]
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1: -1]            # [V**length, length, V]
    prob = torch.ones(len(seqs), dtype=torch.float64)
    for pos in range(length):
        scores = logits[:, pos]
        for w in warpers:
            scores = w(ids[:, : len(prompt) + pos], scores)
        prob *= torch.softmax(scores, -1).gather(1, ids[:, len(prompt) + pos, None])[:, 0]
    return dict(zip(seqs, prob.tolist()))


def chi_square_p(counts: dict, dist: dict) -> float:
    if any(n and not dist.get(c) for c, n in counts.items()):
        return 0.0  # drawn where the distribution has no mass
    cells = sorted(dist, key=dist.get, reverse=True)
    obs, exp, rest_o, rest_e = [], [], 0, 0.0
    for c in cells:  # pool cells expected below 5 draws
        if dist[c] * N >= 5:
            obs.append(counts.get(c, 0))
            exp.append(dist[c] * N)
        else:
            rest_o += counts.get(c, 0)
            rest_e += dist[c] * N
    if rest_e > 0:
        obs.append(rest_o)
        exp.append(rest_e)
    return chisquare(obs, exp).pvalue


def tally(results) -> dict[tuple, int]:
    """How often each output was drawn, from generate()'s results."""
    counts: dict[tuple, int] = {}
    for tokens, _, _ in results:
        counts[tuple(tokens)] = counts.get(tuple(tokens), 0) + 1
    return counts


def uniform_q(q):
    """A drafter's q (per row, or [B, K, V]) replaced by uniform rows: verifying drafts against
    a q they were not drawn from is the negative control of a sampling test."""
    if q is None:
        return None
    return [None if r is None else torch.full_like(r, 1 / r.shape[-1]) for r in q]


def assert_follows(counts: dict, target, other, params: SamplingParams, prompt=PROMPT,
                   length=LENGTH) -> None:
    """The draws fit the target's exact distribution, and the test has the power to tell them
    from another model's (the negative control)."""
    assert chi_square_p(counts, exact_distribution(target, params, prompt, length)) > 1e-3
    assert chi_square_p(counts, exact_distribution(other, params, prompt, length)) < 1e-6


@pytest.mark.parametrize("k,params,auto", [
    (3, SamplingParams(temperature=1.0), False),
    (1, SamplingParams(temperature=1.0), False),
    (4, SamplingParams(temperature=0.8, top_k=4, top_p=0.9), False),
    # k chosen per round from what earlier rounds of all sequences accepted.
    (2, SamplingParams(temperature=1.0), True),
])
def test_speculative_samples_follow_target(small_pair, k, params, auto):
    target, draft = engines(small_pair, max_sequences=N, max_len=16)
    # Speculation from the first token on: with 3 tokens, a prefill-alone round would leave
    # little for K to act on.
    reqs = [Request(PROMPT, LENGTH, k, SamplingParams(params.temperature, params.top_k,
                                                      params.top_p, seed=1_000_003 * i + 7),
                    auto=auto, prefill_alone=False)
            for i in range(N)]
    rounds = []
    results = generate(target, draft, reqs, planner=AcceptanceOnly(k) if auto else None,
                       on_round=rounds.append)
    if auto:  # the policy chose 0, 1 and 2 drafts, each often enough to matter
        chosen = [r.k for r in rounds]
        assert all(chosen.count(j) > N // 20 for j in range(3)), {j: chosen.count(j) for j in range(3)}
    counts = tally(results)
    rate = sum(s.total_accepted_draft_tokens for _, s, _ in results) / sum(
        s.total_draft_tokens for _, s, _ in results)
    assert 0.2 < rate < 0.95, rate  # both accept and reject paths carry weight
    assert_follows(counts, small_pair[0], small_pair[1], params)


class GreedyDraft(LocalDrafter):
    """The draft model proposing its argmax whatever the request samples: one-hot q."""
    async def propose(self, call: ProposeCall):
        return await super().propose(ProposeCall(call.seq_id, call.start, call.tokens, call.k,
                                                 SamplingParams()))


@pytest.mark.parametrize("proposer,prompt,k,params", [
    ("ngram", [0, 4, 1, 3, 0, 4, 1, 3], 3, SamplingParams(temperature=1.0)),
    ("ngram", [0, 3, 4, 0, 3], 2, SamplingParams(temperature=0.8, top_k=4, top_p=0.9)),
    ("greedy_draft", [1, 0, 0, 1, 0, 0, 1], 3, SamplingParams(temperature=1.0)),
])
def test_one_hot_proposals_samples_follow_target(small_pair, proposer, prompt, k, params):
    target, draft = engines(small_pair, max_sequences=N, max_len=16)
    lookup = proposer == "ngram"
    reqs = [Request(prompt, LENGTH, k, SamplingParams(params.temperature, params.top_k,
                                                      params.top_p, seed=1_000_003 * i + 7),
                    prefill_alone=False, proposer="ngram" if lookup else "draft")
            for i in range(N)]
    results = generate(target, draft, reqs, drafter=None if lookup else GreedyDraft(draft),
                       ngram=NgramProposer() if lookup else None)
    counts = tally(results)
    proposed = sum(s.total_draft_tokens for _, s, _ in results)
    rate = sum(s.total_accepted_draft_tokens for _, s, _ in results) / proposed
    assert proposed > N and 0.15 < rate < 0.9, (proposed, rate)  # accepts and rejects weigh
    assert_follows(counts, small_pair[0], small_pair[1], params, prompt)


def test_hybrid_proposals_chosen_per_round_samples_follow_target(small_pair):
    """Per round, the policy picks prompt lookup (one-hot q) or the sampling draft (its q) and
    k from what earlier rounds accepted: the output is still exactly the target's."""
    prompt, params = [0, 3, 4, 0, 3], SamplingParams(temperature=1.0)
    target, draft = engines(small_pair, max_sequences=N, max_len=16)
    reqs = [Request(prompt, LENGTH, 2, SamplingParams(1.0, seed=1_000_003 * i + 7), auto=True,
                    prefill_alone=False, proposer="hybrid") for i in range(N)]
    planner, rounds = AcceptanceOnly(2), []
    # A server that has seen one lookup round accept 1 of 2: a new sequence starts with lookup
    # (nearly free), and after a rejection its own estimate turns it to the draft.
    planner.acceptance["ngram"].add(2, 1)
    results = generate(target, draft, reqs, planner=planner, on_round=rounds.append,
                       ngram=NgramProposer())
    by = {p: sum(r.k for r in rounds if r.proposer == p) for p in ("draft", "ngram")}
    assert min(by.values()) > N // 10, by          # both proposers carry weight
    counts = tally(results)
    assert_follows(counts, small_pair[0], small_pair[1], params, prompt)
