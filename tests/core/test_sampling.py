"""The counter-based draws (specdec/runtime/sampling.py) at the hash's extreme: one draw in 2**24
has the largest hash, whose uniform rounded to 1.0 in float32 before 2026-11-27."""
import torch

from specdec.records import SamplingParams
from specdec.runtime.sampling import RESAMPLE, BatchSampling, sample, uniforms
from specdec.runtime.verify import verify

CPU = torch.device("cpu")
V = 16384
# Found by search: this seed's draw at position 5 for vocabulary index 13255 has the largest
# hash (h >> 8 == 2**24 - 1).
SEED, POSITION, TOP = 64, 5, 13255


def rows(*params: SamplingParams) -> BatchSampling:
    return BatchSampling.stack(list(params), CPU)


def test_uniforms_stay_inside_the_open_interval_at_the_largest_hash():
    u = uniforms(rows(SamplingParams(1.0, 0, 1.0, SEED)), torch.tensor([[POSITION]]), RESAMPLE, V)
    assert u.min().item() > 0 and u.max().item() < 1
    assert u[0, 0, TOP].item() == 1.0 - 2.0 ** -24   # the draw itself, clamped, not moved
    assert (-torch.log(u)).min().item() > 0


def test_the_race_never_picks_a_token_of_probability_zero():
    probs = torch.zeros(1, 1, V)
    probs[0, 0, 7] = 1.0
    got = sample(probs, rows(SamplingParams(1.0, 0, 1.0, SEED)), torch.tensor([[POSITION]]),
                 RESAMPLE)
    assert got.item() == 7


def test_a_greedy_row_beside_a_sampled_row_takes_its_argmax():
    """What made a greedy request's text leave the target's, batched beside sampled requests
    (the race runs for every row of a batch that is not all greedy): its bonus token at the
    largest hash was index TOP."""
    logits = torch.randn(2, 1, V, generator=torch.Generator().manual_seed(0))
    p = torch.zeros(2, 1, V)
    p[0, 0, 7] = 1.0                         # the greedy row's one-hot
    p[1] = logits[1].softmax(-1)
    s = rows(SamplingParams(0.0, 0, 1.0, SEED), SamplingParams(0.8, 0, 1.0, 1))
    none = torch.zeros(2, 0, dtype=torch.int64)                   # no drafts: the bonus token
    accepted, nxt = verify(p, None, none, torch.zeros(2, dtype=torch.int64), s,
                           torch.tensor([POSITION, POSITION]))
    assert accepted.tolist() == [0, 0]
    assert nxt[0].item() == 7
