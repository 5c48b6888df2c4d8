"""The draft-step loop, written once for the draft model (engine.py) and the EAGLE-3 head
(eagle/drafting.py): take each step's argmax or sample from its probabilities, feed the token
back as one more position, until every row has its k; one host sync at the end.

A step's batch is built on the device (no host round trip between steps): row b feeds d_{j+1}
at position fed_at[b] + j into its slot while it still drafts, into the scratch slot after.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .kv_cache import KVCache
from .batch import Batch
from .sampling import DRAFT, BatchSampling, probabilities, sample
from .transfer import to_device


@dataclass
class StepRows:
    ks: list[int]                # tokens each row drafts (0: none)
    fed_at: list[int]            # position where each row feeds d_1
    ahead: int                   # d_j's own position minus where it is fed (the head's pairs: 1)
    read_slots: torch.Tensor     # [B] slot each row attends over
    first_slot: int | None       # rows read slots first_slot.. in order (Batch.first_slot)


def draft_steps(rows: StepRows, out: torch.Tensor, sampling: BatchSampling, cache: KVCache,
                greedy: Callable[[torch.Tensor], torch.Tensor],
                logits: Callable[[torch.Tensor], torch.Tensor],
                step: Callable[[Batch, torch.Tensor], torch.Tensor],
                ) -> tuple[list[list[int]], torch.Tensor | None]:
    """Each row's drafted tokens and, when sampling, their probabilities q [B, K, V].

    out: what scores d_1 (logits or the head's hidden state); greedy(out) its argmax [B, 1] as
    target ids, logits(out) its target logits [B, 1, V]; step(batch, out) feeds a step's tokens
    (batch.tokens) and returns what scores the next."""
    ks, k_max, max_len = rows.ks, max(rows.ks), cache.max_len
    if k_max == 0:
        return [[] for _ in ks], None
    dev = out.device
    fed_at = to_device(rows.fed_at, dev)[:, None]                                    # [B, 1]
    ks_t = to_device(ks, dev)[:, None]                                                # [B, 1]
    write_all = rows.read_slots[:, None]                                              # [B, 1]
    no_row = torch.zeros(len(ks), dtype=torch.int64, device=dev)
    end = max(rows.fed_at)
    drafted, probs = [], []
    for j in range(k_max):
        if sampling.all_greedy:   # the argmax is the one-hot's only token: no q goes back
            d = greedy(out)                                                           # [B, 1]
        else:
            p = probabilities(logits(out), sampling)                                 # [B, 1, V]
            d = sample(p, sampling, fed_at + rows.ahead + j, DRAFT)                  # [B, 1]
            probs.append(p)
        drafted.append(d)
        if j + 1 == k_max:
            break
        write = write_all if min(ks) > j + 1 else torch.where(ks_t > j + 1, write_all,
                                                                cache.scratch)
        batch = Batch(d, (fed_at + j).clamp(max=max_len - 1), write, rows.read_slots,
                      min(end + j + 1, max_len), no_row, rows.first_slot,
                      min(end + j, max_len - 1) + 1)
        out = step(batch, out)   # a graph's output: read before its next replay
    tokens = torch.cat(drafted, 1).tolist()                                           # the sync
    q = torch.cat(probs, 1) if probs else None                                        # [B, K, V]
    return [t[:k] for t, k in zip(tokens, ks)], q
