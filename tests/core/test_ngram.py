"""The n-gram (prompt lookup) proposer: matching, rollback, and greedy exactness in the loop."""
import asyncio
import random

import pytest
import torch
import transformers

from specdec.proposers.ngram import NgramProposer
from specdec.records import ProposeCall, Request
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines, generate


def propose(p: NgramProposer, tokens: list[int], k: int, seq_id: int = 1, start: int = 0):
    call = ProposeCall(seq_id, start, tokens, k, SamplingParams())
    return asyncio.run(p.propose(call))


def reference(history: list[int], k: int, max_n: int, min_n: int) -> list[int]:
    """The rule by a scan: longest suffix n with an earlier occurrence, its latest one; what
    followed it, repeated when it reaches the end (the text loops)."""
    end = len(history)
    for n in range(min(max_n, end - 1), min_n - 1, -1):
        for e in range(end - 1, n - 1, -1):
            if history[e - n:e] == history[end - n:]:
                return [history[e + i % (end - e)] for i in range(k)]
    return []


def test_proposes_what_followed_the_match():
    out = propose(NgramProposer(max_n=3, min_n=1), [1, 2, 3, 4, 9, 1, 2, 3], k=3)
    assert out.tokens == [4, 9, 1] and out.probs is None


def test_longest_n_first_then_most_recent():
    history = [7, 2, 3, 5, 8, 2, 3, 6, 7, 2, 3]
    assert propose(NgramProposer(max_n=3, min_n=2), history, 2).tokens == [5, 8]
    assert propose(NgramProposer(max_n=2, min_n=2), history, 2).tokens == [6, 7]
    assert propose(NgramProposer(max_n=2, min_n=1), [1, 2, 10, 1, 2, 20, 1, 2], 1).tokens == [20]


def test_min_n_and_no_match_propose_nothing():
    assert propose(NgramProposer(max_n=3, min_n=2), [5, 1, 6, 1], 4).tokens == []
    assert propose(NgramProposer(max_n=3, min_n=1), [5, 1, 6, 1], 4).tokens == [6, 1, 6, 1]
    assert propose(NgramProposer(), [4], 4).tokens == []
    with pytest.raises(ValueError):
        NgramProposer(max_n=2, min_n=3)


def test_a_continuation_that_reaches_the_end_repeats_its_period():
    p = NgramProposer(max_n=2, min_n=2)
    # The latest earlier "8 9" is 2 tokens back: the text loops "8 9", and the proposal with it.
    assert propose(p, [8, 9, 1, 8, 9, 8, 9], 5).tokens == [8, 9, 8, 9, 8]
    assert p.lookup(1, 12, []).n == 2     # held: the 7 tokens + its 5 proposed ones
    assert propose(NgramProposer(max_n=2, min_n=2), [3, 4, 5, 6, 3, 4], 6).tokens == \
        [5, 6, 3, 4, 5, 6]
    # Far enough back, what followed is proposed as it was.
    assert propose(NgramProposer(max_n=2, min_n=2), [3, 4, 5, 6, 7, 3, 4], 3).tokens == [5, 6, 7]


def test_lookup_reports_without_proposing():
    p = NgramProposer(max_n=3, min_n=2)
    m = p.lookup(1, 0, [1, 2, 3, 4, 9, 1, 2, 3])
    assert (m.n, m.at, m.period, m.proposes(8), m.proposes(2)) == (3, 3, 5, 8, 2)
    assert len(p.seqs[1].tokens) == 8                       # the committed tokens only
    assert propose(p, [], 2, start=8).tokens == [4, 9]
    assert p.lookup(1, 8, []).n == 3 and len(p.seqs[1].tokens) == 8


def test_rollback_through_start_and_release():
    p = NgramProposer(max_n=2, min_n=1)
    assert propose(p, [1, 2, 3, 1, 2], 3).tokens == [3, 1, 2]   # history now holds them too
    # The target accepted one (3) and corrected with 7: roll back to 6, append 7.
    assert propose(p, [7], 3, start=6).tokens == []
    assert p.seqs[1].tokens == [1, 2, 3, 1, 2, 3, 7]
    with pytest.raises(ValueError):
        propose(p, [1], 3, start=20)
    asyncio.run(p.release(1))
    assert 1 not in p.seqs
    with pytest.raises(ValueError):
        propose(p, [1], 3, start=5)                            # released: holds nothing


def test_incremental_index_equals_a_scan_under_random_rollbacks():
    rng = random.Random(0)
    for max_n, min_n in [(4, 2), (3, 1), (1, 1)]:
        p = NgramProposer(max_n=max_n, min_n=min_n)
        committed: list[int] = []
        held = 0
        for _ in range(300):
            start = rng.randint(max(0, held - 6), held) if committed else 0
            start = min(start, len(committed))
            committed += [rng.randrange(4) for _ in range(rng.randint(1, 3))]
            k = rng.randint(1, 6)
            out = propose(p, committed[start:], k, start=start).tokens
            assert out == reference(committed, k, max_n, min_n)
            # A random share of the proposal is "accepted" and becomes committed.
            accepted = rng.randint(0, len(out))
            committed += out[:accepted]
            held = len(committed) - accepted + min(accepted, max(len(out) - 1, 0))
        fresh = NgramProposer(max_n=max_n, min_n=min_n)
        fresh.lookup(2, 0, p.seqs[1].tokens)
        assert fresh.seqs[2].ends == p.seqs[1].ends


# Greedy exactness in the loop, on prompts where lookup finds matches and some are right.
MAX_TOKENS = 32


def ngram_prompts():
    gen = torch.Generator().manual_seed(9)
    rand = [torch.randint(0, 97, (12,), generator=gen).tolist() for _ in range(3)]
    return rand + [r + r[:5] for r in rand] + [[5, 6, 7, 8, 9] * 4, [3, 1] * 7 + [3]]


@pytest.fixture(scope="module")
def hf_greedy_ngram(pair_dir):
    ref = transformers.AutoModelForCausalLM.from_pretrained(pair_dir[0], dtype=torch.float64)
    out = []
    for p in ngram_prompts():
        ids = torch.tensor([p])   # the mask, or generate would hide id 0 as padding
        ids = ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS,
                           do_sample=False, eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(p):].tolist())
    return out


class Counting(NgramProposer):
    """Records every proposal's length, to check what the loop counts as drafted."""
    def __init__(self, **kw):
        super().__init__(**kw)
        self.sizes: list[int] = []

    async def propose(self, call):
        out = await super().propose(call)
        self.sizes.append(len(out.tokens))
        return out


@pytest.mark.parametrize("k,min_n", [(4, 2), (8, 1)])
def test_greedy_with_ngram_equals_target_alone(pair_dir, hf_greedy_ngram, k, min_n):
    target, _ = engines(pair_dir)
    proposer = Counting(max_n=4, min_n=min_n)
    results = generate(target, None, [Request(p, MAX_TOKENS, k, proposer="ngram")
                                      for p in ngram_prompts()], ngram=proposer)
    assert [r[0] for r in results] == hf_greedy_ngram
    stats = [r[1] for r in results]
    proposed = sum(s.total_draft_tokens for s in stats)
    accepted = sum(s.total_accepted_draft_tokens for s in stats)
    assert proposed == sum(proposer.sizes)       # the loop counts what was proposed, not k
    assert 0 < accepted < proposed and any(0 < n < k for n in proposer.sizes)
    # Rounds without a match (past each prompt's prefill) went on without a lookup proposal.
    assert sum(s.rounds for s in stats) > len(proposer.sizes) + len(stats)
    assert sum(s.rounds for s in stats) < sum(s.num_output_tokens for s in stats)
    assert target.pool.active == 0 and not proposer.seqs
