"""A parallel draft (PARD, arXiv 2504.18583): K proposals from one forward pass.

A PARD checkpoint is a causal LM whose config.json names a mask token (`pard_token`). Fed the
committed tokens it has not cached and then k-1 mask tokens, it reads proposal j (1-based) at
the last committed token's row + j - 1: row 0 predicts d_1 as any language model does, the
mask rows predict d_2..d_k without seeing d_1..d_{k-1}; the mask token itself is never
proposed. One pass costs about one token's weight reads on a GPU, whatever k is.

The mask rows' KV is dropped; the committed tokens' is kept. The draft still keeps the draft
model's contract with its callers (proposers/base.py, in_target.py): after proposing it claims to
hold d_1..d_{k-1}, and those of them that were accepted are fed lazily, ahead of the next
call's tokens, in that call's one pass.

Sampling draws every d_j from its own row's q_j, which does not depend on d_1..d_{j-1}:
speculative sampling stays exact for any proposal drawn from the q it is verified with.
"""
from __future__ import annotations

import torch

from .batch import Batch, rows_from
from ..records import Proposal, ProposeCall, SlotError
from .sampling import DRAFT, BatchSampling, probabilities, sample
from .transfer import to_device


class ParallelDrafts:
    def __init__(self, mask_token: int):
        self.mask = mask_token
        # seq -> (tokens really cached, its last drafts d_1..d_{k-1} claimed after them)
        self.claimed: dict[int, tuple[int, list[int]]] = {}

    def propose(self, engine, calls: list[ProposeCall]) -> list[Proposal | SlotError]:
        """engine.Engine.propose for the engine holding this (engine imports this module)."""
        slots, results, good = engine._open(calls, [c.k - 1 for c in calls])
        if not good:
            return results
        cs = [calls[i] for i in good]
        starts, rows = [], []
        v_own = engine.model.args.vocab_size
        for c in cs:
            cached, drafts = self.claimed.pop(c.seq_id, (c.start, []))
            start = min(c.start, cached)   # accepted drafts it claims: fed now
            fed = drafts[: c.start - start] + c.tokens
            starts.append(start)
            rows.append([t if t < v_own else 0 for t in fed] + [self.mask] * (c.k - 1))
        last = [len(r) - c.k for r, c in zip(rows, cs)]   # the last committed token's row
        first = [s + j + 1 for s, j in zip(starts, last)]   # d_1's position
        batch = Batch.build(rows, starts, slots, engine.cache, engine.device)
        hidden = engine._forward(batch)                                     # [B, T, D]
        k_max = max(c.k for c in cs)
        logits = engine._logits(rows_from(hidden, last, k_max))            # [B, K, V]
        if self.mask < logits.shape[-1]:   # never proposed: a draft little trained copies it
            logits[..., self.mask] = float("-inf")                            # [B, K, V]
        s = BatchSampling.stack([c.sampling for c in cs], engine.device)
        if s.all_greedy:
            q, drafted = None, logits.argmax(-1)                              # [B, K]
        else:
            q = probabilities(logits, s)                                      # [B, K, V]
            positions = to_device(first, engine.device)[:, None] + torch.arange(
                k_max, device=engine.device)
            drafted = sample(q, s, positions, DRAFT)
        tokens = drafted.tolist()                                             # the one sync
        for b, (i, c) in enumerate(zip(good, cs)):
            mine = tokens[b][: c.k]
            engine.pool.set_length(c.seq_id, first[b] + c.k - 1)
            self.claimed[c.seq_id] = (first[b], mine[:-1])
            results[i] = Proposal(mine, None if c.sampling.greedy else q[b, : c.k])
        return results

    def release(self, seq_id: int) -> None:
        self.claimed.pop(seq_id, None)
