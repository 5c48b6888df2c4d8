"""Medusa-1 heads' forward (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration
Framework with Multiple Decoding Heads", FasterDecoding/Medusa's medusa_model.py): K heads on the
target's last hidden state, each a stack of residual blocks and an LM head of its own.

    h        the target's hidden state after its final norm at position t, the position whose
             logits gave the target's next token x[t + 1]                            [B, H]
    block    x + SiLU(W x + b)                                                       [B, H]
    head i   lm_head_i(block_{i,L-1}(... block_{i,0}(h)))                            [B, V]
             a guess at x[t + 2 + i]: the token i + 1 positions after the target's next

No KV cache and no sequence state: the K guesses of a round come from one hidden state at once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import MedusaArgs


class ResBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


def head_layers(m: MedusaArgs) -> nn.Sequential:
    """One head as FasterDecoding builds it: blocks 0..L-1, then its LM head at index L (the
    checkpoint's names are `{i}.{j}.linear.*` and `{i}.{L}.weight`)."""
    return nn.Sequential(*(ResBlock(m.hidden_size) for _ in range(m.num_layers)),
                         nn.Linear(m.hidden_size, m.vocab_size, bias=False))


class MedusaHead(nn.Module):
    def __init__(self, m: MedusaArgs):
        super().__init__()
        self.args = m
        self.heads = nn.ModuleList(head_layers(m) for _ in range(m.num_heads))

    def forward(self, hidden: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        """hidden [..., H] -> logits [..., K, V] float32 (the first `heads` heads only: a
        round drafting k < K tokens needs no more)."""
        hidden = hidden.to(self.heads[0][-1].weight.dtype)
        return torch.stack([h(hidden) for h in self.heads[:heads]], -2).float()
