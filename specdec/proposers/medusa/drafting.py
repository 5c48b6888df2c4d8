"""Medusa heads' work inside a target verification: the next round's k tokens at once.

After the target has verified row b (N_b committed positions cached; x_b, its own next token,
committed at position N_b), v.hidden[b] is the final-normed hidden state that scored x_b. Head i
reads it and guesses the token at position N_b + 1 + i: d_1 .. d_k come from heads 0 .. k - 1
in one forward, each independent of the others' guesses (Medusa-1 without its tree: one chain).
Sampled, d_{i+1} is drawn from head i's processed distribution with the position's own
uniforms, and that distribution is q for the verification that checks it. Nothing is cached
per sequence: a round with no proposal, or after a restart, costs nothing to catch up.
"""
from __future__ import annotations

import torch

from ...runtime.in_target import InTargetDrafter, Verified
from ...runtime.sampling import DRAFT, probabilities, sample
from ...runtime.transfer import to_device
from .head import MedusaHead


class MedusaDrafter(InTargetDrafter):
    def __init__(self, head: MedusaHead, vocab_size: int):
        self.head, self.vocab_size = head, vocab_size
        self.max_k = head.args.num_heads   # a round drafts one token a head

    def draft(self, v: Verified) -> tuple[list[list[int]], torch.Tensor | None]:
        ks = [min(k, self.max_k) for k in v.ks]
        k_max = max(ks)
        if k_max == 0:
            return [[] for _ in ks], None
        logits = self.head(v.hidden, k_max)[..., : self.vocab_size]                # [B, k, V]
        s = v.sampling
        if s.all_greedy:
            return [t[:k] for t, k in zip(logits.argmax(-1).tolist(), ks)], None
        p = probabilities(logits, s)                                                # [B, k, V]
        ends = to_device(v.ends, p.device)[:, None]
        d = sample(p, s, ends + 1 + torch.arange(k_max, device=p.device), DRAFT)    # [B, k]
        return [t[:k] for t, k in zip(d.tolist(), ks)], p
