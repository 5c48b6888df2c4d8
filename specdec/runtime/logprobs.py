"""What the target's distribution gave each scored token: a committed token at its position, or
a prompt's token (echo, prompt scoring). The rows come from the verification that committed
them, so speculation returns the target's own logprobs, never the draft's.
"""
from __future__ import annotations

import torch

from ..records import SamplingParams, TokenLogprob
from .sampling import BatchSampling, log_probabilities

# Rows scored at once: a long prompt's [rows, V] fp32 block stays a few hundred MB at most.
ROWS_AT_ONCE = 256


def scored(logits: torch.Tensor, tokens: list[int], sampling: SamplingParams,
           top: int) -> list[TokenLogprob]:
    """logits [N, V] at the positions that produced `tokens` [N] -> a TokenLogprob each, with
    the `top` likeliest ids there."""
    if not tokens:
        return []
    s = BatchSampling.stack([sampling], logits.device)
    ids = torch.tensor(tokens, device=logits.device)
    chosen, top_lp, top_ids = [], [], []
    for a in range(0, len(tokens), ROWS_AT_ONCE):
        lp = log_probabilities(logits[None, a:a + ROWS_AT_ONCE], s)[0]          # [n, V]
        chosen.append(lp.gather(-1, ids[a:a + ROWS_AT_ONCE, None])[:, 0])
        if top:
            values, order = lp.topk(min(top, lp.shape[-1]), dim=-1)
            top_lp.append(values)
            top_ids.append(order)
    chosen_l = torch.cat(chosen).tolist()
    if not top:
        return [TokenLogprob(c) for c in chosen_l]
    pairs = zip(torch.cat(top_ids).tolist(), torch.cat(top_lp).tolist())
    return [TokenLogprob(c, tuple(zip(i, v))) for c, (i, v) in zip(chosen_l, pairs)]
