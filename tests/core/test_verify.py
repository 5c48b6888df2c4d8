"""verify() with q = None is one-hot q at the drafts, for any p: greedy or sampled; and
verify_greedy, which takes only the argmax, is verify when every row is greedy, whatever q."""
import torch

from specdec.runtime.sampling import BatchSampling, SamplingParams, probabilities
from specdec.runtime.verify import verify, verify_greedy

B, K, V = 64, 4, 7


def _case(temperature: float):
    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(B, K + 1, V, generator=gen, dtype=torch.float64) * 2
    s = BatchSampling.stack([SamplingParams(temperature, seed=i) for i in range(B)],
                            torch.device("cpu"))
    p = probabilities(logits, s)
    # Drafts from p's likely tokens, so rows accept some and reject some.
    drafts = logits.argmax(-1)[:, :K]
    drafts[::3, 1] = (drafts[::3, 1] + 1) % V
    num_drafts = torch.randint(0, K + 1, (B,), generator=gen)
    q = torch.nn.functional.one_hot(drafts, V).to(p.dtype)
    q = q * (torch.arange(K) < num_drafts[:, None])[..., None]  # zero past a row's drafts
    return p, q, drafts, num_drafts, s, torch.arange(B) * 3


def test_no_q_equals_one_hot_q_when_sampling():
    p, q, drafts, num_drafts, s, first = _case(temperature=1.0)
    acc_none, nxt_none = verify(p, None, drafts, num_drafts, s, first)
    acc_q, nxt_q = verify(p, q, drafts, num_drafts, s, first)
    assert torch.equal(acc_none, acc_q) and torch.equal(nxt_none, nxt_q)
    rejected = acc_none < num_drafts
    assert 0 < rejected.sum() < B and (acc_none > 0).any()   # both paths exercised
    # A rejected one-hot draft is never its own correction.
    d_m = drafts.gather(1, acc_none.clamp(max=K - 1)[:, None])[:, 0]
    assert not (rejected & (nxt_none == d_m)).any()


def test_no_q_equals_one_hot_q_when_greedy():
    p, q, drafts, num_drafts, s, first = _case(temperature=0.0)
    acc_none, nxt_none = verify(p, None, drafts, num_drafts, s, first)
    acc_q, nxt_q = verify(p, q, drafts, num_drafts, s, first)
    assert torch.equal(acc_none, acc_q) and torch.equal(nxt_none, nxt_q)
    assert torch.equal(nxt_none, p.argmax(-1).gather(1, acc_none[:, None])[:, 0])


def test_engine_mixed_batch_matches_calls_without_q_alone(pair_dir):
    """A call without draft_probs gets the same verdict alone (q = None) as beside a call that
    has them (its rows then one-hot in a materialized q)."""
    from specdec.records import VerifyCall
    from tests.core.conftest import engines
    target, _ = engines(pair_dir)
    prompt, drafts = [5, 9, 2, 41, 7], []
    for _ in range(4):  # the target's greedy tokens: likely when sampling too, so some pass
        call = VerifyCall(1, 0, prompt + drafts, [], None, SamplingParams())
        drafts += target.verify([call])[0].tokens
        target.release([1])
    drafts[2] = (drafts[2] + 1) % 97
    q_other = torch.softmax(torch.randn(4, 97, generator=torch.Generator().manual_seed(0),
                                        dtype=torch.float64), -1)
    alone, mixed = [], []
    for seed in range(40):
        call = VerifyCall(1, 0, prompt, drafts, None, SamplingParams(1.0, seed=seed))
        other = VerifyCall(2, 0, prompt, drafts, q_other, SamplingParams(1.0, seed=seed))
        alone.append(target.verify([call])[0])
        target.release([1])
        mixed.append(target.verify([call, other])[0])
        target.release([1, 2])
    assert [(v.tokens, v.num_accepted) for v in alone] == \
        [(v.tokens, v.num_accepted) for v in mixed]
    assert any(v.num_accepted < len(drafts) for v in alone) and any(v.num_accepted for v in alone)


def test_greedy_rows_need_only_the_argmax():
    p, q, drafts, num_drafts, s, first = _case(temperature=0.0)
    logits = p + torch.rand(p.shape, dtype=p.dtype) * 0.5   # the argmax is p's one-hot
    top = p.argmax(-1)
    fast = verify_greedy(logits, drafts, num_drafts)
    # A sampled draft's q (any distribution with mass on its drafts) changes nothing at t = 0.
    gen = torch.Generator().manual_seed(5)
    sampled_q = torch.rand(B, K, V, generator=gen, dtype=p.dtype) + q
    sampled_q = sampled_q / sampled_q.sum(-1, keepdim=True)
    for qq in (None, q, sampled_q):
        acc, nxt = verify(p, qq, drafts, num_drafts, s, first)
        assert torch.equal(fast[0], acc) and torch.equal(fast[1], nxt)
    assert 0 < (fast[0] < num_drafts).sum() < B and (fast[0] > 0).any()
    none = verify_greedy(logits[:, :1], drafts[:, :0], torch.zeros(B, dtype=torch.int64))
    assert torch.equal(none[0], torch.zeros(B, dtype=torch.int64))
    assert torch.equal(none[1], top[:, 0])
