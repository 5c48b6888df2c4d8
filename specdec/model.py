"""One decoder for the Llama family (Llama 2/3, Mistral, Qwen2), used by draft and target alike.

Touvron et al. 2023 (Llama), Su et al. 2021 (RoPE), Ainslie et al. 2023 (grouped-query
attention). Module attribute names follow Hugging Face's, except that q/k/v and gate/up are one
matrix each (`FUSED`; weights.py concatenates them at load): one matmul in place of three, and
on the CPU and at batch 1 every operator call costs about as much as its arithmetic.

Every forward is ragged: row b appends its tokens at its own positions into its own KV slot, so
a batch mixes prefills, K+1-token verifications and single draft steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import attention
from .config import ModelArgs
from .kv_cache import KVCache


@dataclass
class Batch:
    """Where each token of a ragged batch goes. Built on the host by `Batch.build`."""
    tokens: torch.Tensor        # [B, T] ids, padding is 0
    positions: torch.Tensor     # [B, T] absolute positions
    write_slots: torch.Tensor   # [B, T] cache slot per token; padding goes to the scratch slot
    read_slots: torch.Tensor    # [B] slot each row attends over
    kv_len: int                 # keys to read: max over rows of (last position + 1)
    last: torch.Tensor          # [B] index of each row's last real token
    first_slot: int | None = None  # rows read slots first_slot.. in order: a view, no gather
    max_end: int = 0            # host bound on a row's first position + T (flash-attn's writes)

    @classmethod
    def build(cls, rows: list[list[int]] | torch.Tensor, starts: list[int], slots: list[int],
              cache: KVCache, device: torch.device, lengths: list[int] | None = None) -> "Batch":
        """Row b appends its first lengths[b] tokens to slot slots[b], from position starts[b].

        rows: token lists (padded here), or a [B, T] device tensor (no host round trip).
        lengths: real tokens per row (default: all); the rest is padding.
        """
        if isinstance(rows, torch.Tensor):
            t_max = rows.shape[1]
            tokens = rows
            n = lengths or [t_max] * len(starts)
        else:
            n = lengths or [len(r) for r in rows]
            t_max = max(len(r) for r in rows)
            tokens = torch.tensor([r + [0] * (t_max - len(r)) for r in rows], dtype=torch.int64)
        start = torch.tensor(starts, dtype=torch.int64)[:, None]
        t = torch.arange(t_max)[None, :]
        real = t < torch.tensor(n)[:, None]
        positions = (start + t).clamp(max=cache.max_len - 1)
        write = torch.where(real, torch.tensor(slots)[:, None], cache.scratch)
        kv_len = min(max(s + max(k, 1) for s, k in zip(starts, n)), cache.max_len)
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        return cls(tokens.to(device), positions.to(device), write.to(device),
                   torch.tensor(slots).to(device), kv_len,
                   (torch.tensor(n).clamp(min=1) - 1).to(device),
                   slots[0] if consecutive else None,
                   min(max(starts), cache.max_len - 1) + t_max)

def rope_frequencies(args: ModelArgs) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], with linear or Llama 3.1 scaling."""
    dim = args.head_dim
    inv = 1.0 / (args.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    if args.rope_type == "linear":
        return inv / args.rope_factor
    if args.rope_type == "llama3":
        low_wavelen = args.rope_original_max_position / args.rope_low_freq_factor
        high_wavelen = args.rope_original_max_position / args.rope_high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / args.rope_factor, inv)
        smooth = (args.rope_original_max_position / wavelen - args.rope_low_freq_factor) / (
            args.rope_high_freq_factor - args.rope_low_freq_factor)
        smoothed = (1 - smooth) * scaled / args.rope_factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv


# Checkpoint tensors that are one tensor here, concatenated along the output dimension in order.
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, 1, D], sin negated in its first half (Hugging Face's
    half-split layout: x * cos + cat(-x2, x1) * sin, with the sign moved into sin)."""
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.layer, self.args = layer, args
        h, kv, d = args.num_heads, args.num_kv_heads, args.head_dim
        self.qkv_proj = nn.Linear(args.hidden_size, (h + 2 * kv) * d, bias=args.qkv_bias)
        self.o_proj = nn.Linear(h * d, args.hidden_size, bias=args.o_bias)

    def forward(self, x, cos, sin, plan: attention.Plan, batch: Batch,
                cache: KVCache) -> torch.Tensor:
        b, t, _ = x.shape
        h, kv = self.args.num_heads, self.args.num_kv_heads
        qkv = self.qkv_proj(x).view(b, t, h + 2 * kv, self.args.head_dim)
        qk = rotate(qkv[:, :, : h + kv], cos, sin)                            # [B, T, H+KV, D]
        q, k, v = qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv:]
        out = attention.attend(plan, q, k, v, self.layer, batch, cache)
        return self.o_proj(out.reshape(b, t, -1))


class MLP(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate_up_proj = nn.Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = nn.Linear(args.intermediate_size, args.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.self_attn = Attention(args, layer)
        self.mlp = MLP(args)
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)

    def forward(self, x, cos, sin, plan, batch: Batch, cache: KVCache) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, plan, batch, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(args, i) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)


class Transformer(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.args = args
        self.model = Backbone(args)
        self.lm_head = nn.Linear(args.hidden_size, args.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_frequencies(args), persistent=False)
        self.flash: attention.FlashKernel | None = None  # set by the engine (CUDA, fp16/bf16)

    def tie_weights(self) -> None:
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        """Hidden states [B, T, hidden] after the final norm; the batch's KV is now cached."""
        x = self.model.embed_tokens(batch.tokens)
        freqs = batch.positions[..., None].float() * self.inv_freq              # [B, T, D/2]
        cos = torch.cat((freqs, freqs), dim=-1).cos()[:, :, None, :]            # [B, T, 1, D]
        half = freqs.sin()
        sin = torch.cat((-half, half), dim=-1)[:, :, None, :]                   # rotate's sign
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        plan = attention.plan(batch, cache, self.args.sliding_window, self.flash)
        for layer in self.model.layers:
            x = layer(x, cos, sin, plan, batch, cache)
        return self.model.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
