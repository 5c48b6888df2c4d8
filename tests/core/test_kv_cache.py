"""Slot pool and rollback: a sequence rolls back to any length without disturbing the others."""
import pytest
import torch

from specdec.runtime.kv_cache import KVCache, SlotPool
from specdec.runtime.batch import Batch
from specdec.records import SlotError, VerifyCall
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines


def greedy_next(engine, seq_id, start, tokens):
    verdict, = engine.verify([VerifyCall(seq_id, start, tokens, [], None, SamplingParams())])
    return verdict.tokens[0]


def test_rollback_then_diverge_equals_fresh(pair_dir):
    target, _ = engines(pair_dir)
    a, b = list(range(3, 23)), [50, 51, 52, 53]
    greedy_next(target, 1, 0, a)                          # cache 20 tokens of sequence 1
    greedy_next(target, 2, 0, [9, 8, 7])                  # a neighbour in another slot
    k_before = target.cache.k[0][target.pool.slots[2]].clone()
    rolled = greedy_next(target, 1, 8, b)                 # back to 8, then a different suffix
    fresh = greedy_next(target, 3, 0, a[:8] + b)
    assert rolled == fresh
    assert target.pool.lengths[1] == 8 + len(b)  # every fed token cached, none drafted
    assert torch.equal(target.cache.k[0][target.pool.slots[2]], k_before)


def test_pool_limits_and_release():
    pool = SlotPool(2)
    assert pool.open(10, 0) != pool.open(11, 0)
    with pytest.raises(SlotError) as full:
        pool.open(12, 0)
    assert full.value.unavailable
    pool.set_length(10, 5)
    with pytest.raises(SlotError, match="past its 5 cached"):
        pool.open(10, 6)
    with pytest.raises(SlotError, match="not open"):
        pool.open(13, 3)
    assert pool.release(10) and not pool.release(10)
    pool.open(12, 0)
    assert pool.active == 2


def test_bad_call_fails_alone(pair_dir):
    target, _ = engines(pair_dir)
    good = VerifyCall(1, 0, [1, 2, 3], [], None, SamplingParams())
    unknown = VerifyCall(2, 5, [1], [], None, SamplingParams())
    out_of_vocab = VerifyCall(3, 0, [10_000], [], None, SamplingParams())
    results = target.verify([unknown, good, out_of_vocab])
    assert isinstance(results[0], SlotError) and isinstance(results[2], SlotError)
    assert results[1].tokens == [greedy_next(target, 4, 0, [1, 2, 3])]


def test_draft_with_a_smaller_vocabulary_accepts_target_ids(pair_dir):
    """Qwen2.5-0.5B drafting for 7B: the target has more rows; their ids reach the draft."""
    from specdec.runtime.engine import Engine
    from specdec.records import ProposeCall
    from specdec.runtime.weights import load_model
    cpu = torch.device("cpu")
    draft = Engine(load_model(pair_dir[1], torch.float64, cpu), 2, 64, cpu, vocab_size=120)
    own = draft.model.args.vocab_size
    proposal, = draft.propose([ProposeCall(1, 0, [3, own + 5, 7], 3, SamplingParams())])
    assert len(proposal.tokens) == 3 and max(proposal.tokens) < own
    rejected, = draft.propose([ProposeCall(2, 0, [3, 120], 2, SamplingParams())])
    assert isinstance(rejected, SlotError)  # beyond even the target's vocabulary


def test_a_proposal_of_zero_tokens_fails_alone(pair_dir):
    from specdec.records import ProposeCall
    _, draft = engines(pair_dir)
    bad, good = draft.propose([ProposeCall(1, 0, [4, 5], 0, SamplingParams()),
                               ProposeCall(2, 0, [4, 5], 3, SamplingParams())])
    assert isinstance(bad, SlotError) and len(good.tokens) == 3


def test_consecutive_slots_read_a_view_and_others_a_gather():
    cache = KVCache(1, 4, 8, 2, 3, torch.float32, torch.device("cpu"))
    cache.k[0].copy_(torch.randn_like(cache.k[0]))
    slots = torch.tensor([1, 2])
    view, _ = cache.read(0, slots, 5, first_slot=1)
    gathered, _ = cache.read(0, slots, 5)
    assert torch.equal(view, gathered) and view.data_ptr() == cache.k[0][1].data_ptr()
    assert Batch.build([[1], [2]], [0, 0], [1, 2], cache, torch.device("cpu")).first_slot == 1
    assert Batch.build([[1], [2]], [0, 0], [2, 1], cache, torch.device("cpu")).first_slot is None
    assert Batch.build([[1], [2]], [0, 0], [0, 3], cache, torch.device("cpu")).first_slot is None
