"""Batched, sync-free sampling: temperature, top-k, top-p, per-request seeds.

Randomness is counter-based: every uniform is a hash of (seed, absolute token position, purpose,
vocabulary index), computed with integer tensor ops on the logits' device. So a row's tokens
depend only on its own seed and positions: the same in a batch of one or of sixty-four, on the
CPU or the GPU, and never a per-row Python loop or a host sync. Sampling is the exponential race
argmax(p / E), E ~ Exp(1), which draws exactly from p (Gumbel-max in probability space).

Temperature 0 turns a row's distribution into the one-hot of its argmax, so greedy decoding and
greedy verification are the same code as sampling: exact match falls out of min(1, p/q).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..records import SamplingParams
from .transfer import to_device

_MASK32 = 0xFFFFFFFF
_MUL = 0x45D9F3B  # < 2**27, so a 32-bit value times it stays inside int64
_BELOW_ONE = 1.0 - 2.0 ** -24   # float32's largest value below 1

# Purposes: independent streams at one position.
DRAFT = 1      # the draft's proposal
ACCEPT = 2     # the target's accept test for a proposal
RESAMPLE = 3   # the target's correction or bonus token


@dataclass
class BatchSampling:
    """SamplingParams of B rows as device tensors."""
    temperature: torch.Tensor  # [B] fp32
    top_k: torch.Tensor        # [B] int64
    top_p: torch.Tensor        # [B] fp32
    seed_lo: torch.Tensor      # [B] int64 in [0, 2**32)
    seed_hi: torch.Tensor      # [B] int64 in [0, 2**32)
    any_filter: bool           # host flag: skip the sort when no row uses top-k/top-p
    all_greedy: bool           # host flag: one-hot rows only, no softmax and no random draws
    any_greedy: bool           # host flag: some row needs its one-hot

    @classmethod
    def stack(cls, params: list[SamplingParams], device: torch.device) -> "BatchSampling":
        return cls(
            temperature=to_device([p.temperature for p in params], device, torch.float32),
            top_k=to_device([p.top_k for p in params], device),
            top_p=to_device([p.top_p for p in params], device, torch.float32),
            seed_lo=to_device([p.seed & _MASK32 for p in params], device),
            seed_hi=to_device([(p.seed >> 32) & _MASK32 for p in params], device),
            any_filter=any(p.top_k > 0 or p.top_p < 1.0 for p in params if not p.greedy),
            all_greedy=all(p.greedy for p in params),
            any_greedy=any(p.greedy for p in params),
        )


def _mix(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (bijective, full avalanche) on int64 tensors holding uint32."""
    x = (((x >> 16) ^ x) * _MUL) & _MASK32
    x = (((x >> 16) ^ x) * _MUL) & _MASK32
    return (x >> 16) ^ x


def uniforms(s: BatchSampling, positions: torch.Tensor, purpose: int, n: int = 1) -> torch.Tensor:
    """Uniforms in (0, 1): [B, P, n] for absolute token positions [B, P]."""
    h = _mix(_mix(s.seed_lo) ^ s.seed_hi)[:, None]            # [B, 1]
    h = _mix(_mix(h ^ purpose) ^ (positions & _MASK32))       # [B, P]
    idx = torch.arange(n, device=positions.device)
    h = _mix(_mix(h[..., None] ^ idx))                        # [B, P, n]
    u = ((h >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    # The top hash, 2**24 - 0.5, rounds to 2**24 in float32: u = 1, -log(u) = -0 and the race's
    # p / E is NaN where p = 0, which argmax takes (a token of probability 0, greedy rows too).
    # Every other u stays as it was.
    return u.clamp_(max=_BELOW_ONE)


def probabilities(logits: torch.Tensor, s: BatchSampling) -> torch.Tensor:
    """Processed distributions [B, P, V] (fp32) from logits [B, P, V]: what each row samples."""
    logits = logits.float()
    if s.all_greedy:
        return _one_hot_argmax(logits)
    probs = torch.softmax(_warped(logits, s), dim=-1)
    if not s.any_greedy:
        return probs
    return torch.where((s.temperature == 0)[:, None, None], _one_hot_argmax(logits), probs)


def apply_token_masks(logits: torch.Tensor, masks: list) -> torch.Tensor:
    """logits [B, P, V] with -inf where row b's mask (int32 [n_b <= P, W], grammar.py's layout,
    or None: no grammar) leaves a token out, at its first n_b positions; in place. One unpacking
    for the rows with a grammar (row by row it cost 30 us a row on the CPU), none for the rest."""
    _, p, v = logits.shape
    width = (v + 31) // 32
    rows = [b for b, m in enumerate(masks) if m is not None]
    words = np.full((len(rows), p, width), -1, np.int32)   # past a row's n_b: all allowed
    for i, b in enumerate(rows):
        m = masks[b]
        n, w = min(len(m), p), min(m.shape[1], width)
        words[i, :n] = 0                                   # ids past the mask's are not allowed
        words[i, :n, :w] = m[:n, :w]
    bits = torch.arange(32, device=logits.device, dtype=torch.int32)
    packed = torch.from_numpy(words).to(logits.device, non_blocking=True)
    keep = ((packed[..., None] >> bits) & 1).bool().flatten(2)[..., :v]         # [R, P, V]
    index = torch.tensor(rows, device=logits.device)
    logits[index] = logits[index].masked_fill(~keep, float("-inf"))
    return logits


def log_probabilities(logits: torch.Tensor, s: BatchSampling) -> torch.Tensor:
    """Log-probabilities [B, P, V] (fp32) from logits [B, P, V]: of what each sampling row
    samples from (-inf where top-k or top-p leave a token out), and of the model's own softmax
    for a greedy row, whose one-hot distribution would say nothing."""
    logits = logits.float()
    warped = _warped(logits, s) if not s.all_greedy else logits
    return torch.log_softmax(torch.where((s.temperature == 0)[:, None, None], logits, warped),
                             dim=-1)


def _warped(logits: torch.Tensor, s: BatchSampling) -> torch.Tensor:
    """fp32 logits [B, P, V] as each row samples from them: over its temperature (a greedy
    row's 1), then top-k and top-p's -inf."""
    scaled = logits / torch.where(s.temperature > 0, s.temperature, 1.0)[:, None, None]
    return _top_k_top_p(scaled, s.top_k, s.top_p) if s.any_filter else scaled


def _one_hot_argmax(logits: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)


def _top_k_top_p(scaled: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Mask with -inf what top-k (k > 0) and then top-p (p < 1) drop; per row, no loop."""
    v = scaled.shape[-1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)          # [B, P, V]
    rank = torch.arange(v, device=scaled.device)
    k = torch.where(top_k > 0, top_k.clamp(max=v), v)[:, None, None]     # [B, 1, 1]
    kth = sorted_logits.gather(-1, (k - 1).expand(*sorted_logits.shape[:-1], 1))
    drop = sorted_logits < kth                                           # ties with k-th stay
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    before = sorted_probs.cumsum(-1) - sorted_probs                      # mass strictly above
    drop = drop | ((before >= top_p[:, None, None]) & (rank > 0))
    return scaled.masked_fill(torch.empty_like(drop).scatter_(-1, order, drop), float("-inf"))


def sample(probs: torch.Tensor, s: BatchSampling, positions: torch.Tensor, purpose: int) -> torch.Tensor:
    """Token ids [B, P] drawn from probs [B, P, V] by the exponential race."""
    if s.all_greedy:  # every row is one-hot: the race has one runner
        return probs.argmax(-1)
    exp = -torch.log(uniforms(s, positions, purpose, probs.shape[-1]))  # [B, P, V]
    return (probs / exp).argmax(-1)
