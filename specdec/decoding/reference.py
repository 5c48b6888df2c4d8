"""The speculative step as the papers write it, for one sequence and a draft model: the
specification loop.py is held to (tests/core/test_reference.py: the same tokens, greedy and
seeded sampling, on held-out prompts).

Leviathan et al. 2023, Algorithm 1 (Chen et al. 2023 alike): the draft proposes k tokens
d_1..d_k, each sampled from its q_j; the target scores all of them in one forward, giving
p_1..p_{k+1}; d_j is accepted while u_j * q_j(d_j) <= p_j(d_j), and at the first rejection the
next token is drawn from norm(max(0, p_j - q_j)), or from p_{k+1} when all k pass. No cache, no
batch, no policy: each model reads the whole sequence every time. Its randomness is the
server's (sampling.py: a uniform for each seed, absolute position and purpose), so a seeded
request draws the same tokens here as served. As served, the first round is the target's
prefill alone, and a round drafts at most what the request has left.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..records import SamplingParams
from ..runtime.sampling import (ACCEPT, DRAFT, RESAMPLE, BatchSampling, probabilities, sample,
                                uniforms)

Logits = Callable[[list[int]], torch.Tensor]   # ids [T] -> the next token's logits [T, V]


def generate(target: Logits, draft: Logits, prompt: list[int], max_tokens: int, k: int,
             params: SamplingParams) -> list[int]:
    s = BatchSampling.stack([params], torch.device("cpu"))
    dist = lambda logits: probabilities(logits[None].float(), s)[0]   # noqa: E731  [T, V]
    at = lambda *positions: torch.tensor([positions])                 # noqa: E731  [1, P]
    seq, out = list(prompt), []
    while len(out) < max_tokens:
        n = len(seq)                     # the first drafted token's position
        k_r = min(k, max_tokens - len(out) - 1) if out else 0
        drafts, q = [], []
        for j in range(k_r):             # d_{j+1} ~ q_{j+1}, at position n + j
            q.append(dist(draft(seq + drafts)[-1:])[0])
            drafts.append(int(sample(q[j][None, None], s, at(n + j), DRAFT)))
        p = dist(target(seq + drafts)[n - 1:])                        # [k_r + 1, V]
        m = 0
        while m < k_r:                   # accept d_{m+1} with probability min(1, p / q)
            d = drafts[m]
            if not bool(uniforms(s, at(n + m), ACCEPT)[0, 0, 0] * q[m][d] <= p[m][d]):
                break
            m += 1
        residual = p[m] if m == k_r else (p[m] - q[m]).clamp_min(0)
        mass = residual.sum()
        residual = residual / mass if mass > 0 else p[m]
        token = int(sample(residual[None, None], s, at(n + m), RESAMPLE))
        seq += drafts[:m] + [token]
        out += drafts[:m] + [token]
    return out
