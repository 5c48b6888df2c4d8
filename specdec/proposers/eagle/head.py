"""The EAGLE-3 head's forward: one decoder layer whose attention reads the token's embedding and
a feature side by side, each under its own norm.

    feature  = fc(cat(target layer outputs))      [B, T, 3 Ht] -> [B, T, H] (first step), or the
               head's own previous output h        [B, T, H] (later draft steps)
    x        = cat(input_layernorm(embed(token)), hidden_norm(feature))      [B, T, 2 H]
    h        = residual + o_proj(attention(x))    residual: the feature, or its norm
               (speculators' norm_before_residual)
    h        = h + mlp(post_attention_layernorm(h))
    logits   = lm_head(norm(h))                   [B, T, Vd] over the draft vocabulary;
               a draft id i is the target's id i + d2t[i]

At position i the pair (feature of target position i, embedding of token i + 1) predicts token
i + 2. The head's KV cache has one layer and the target's slots and lengths: after every
verification the head has cached exactly the positions the target has.
"""
from __future__ import annotations

import torch
from torch import nn

from ...runtime import attention
from ...runtime.kv_cache import KVCache
from ...runtime.batch import Batch
from ...runtime.model import MLP, Attention, Linear, RMSNorm, rope_buffer, rotation
from .config import HeadArgs


class HeadLayer(nn.Module):
    def __init__(self, h: HeadArgs):
        super().__init__()
        a = h.layer
        dim, eps = a.hidden_size, a.rms_norm_eps
        self.input_layernorm = RMSNorm(dim, eps)
        self.hidden_norm = RMSNorm(dim, eps)
        self.self_attn = Attention(a, 0)
        # q, k and v read [embedding, feature]: twice the hidden size.
        self.self_attn.qkv_proj = Linear(
            2 * dim, (a.num_heads + 2 * a.num_kv_heads) * a.head_dim, bias=a.qkv_bias)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(a)
        self.norm_before_residual = h.norm_before_residual

    def forward(self, emb, feature, cos, sin, plan, batch: Batch, cache: KVCache) -> torch.Tensor:
        x, residual = self.attention_input(emb, feature)
        return self.after_attention(residual, self.self_attn(x, cos, sin, plan, batch, cache))

    def attention_input(self, emb: torch.Tensor, feature: torch.Tensor):
        """(x [B, T, 2H] that attention projects, the residual [B, T, H])."""
        normed = self.hidden_norm(feature)
        residual = normed if self.norm_before_residual else feature
        return torch.cat((self.input_layernorm(emb), normed), -1), residual

    def after_attention(self, residual: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """attn: o_proj's output [B, T, H]. Returns h [B, T, H], before the final norm."""
        x = residual + attn
        return x + self.mlp(self.post_attention_layernorm(x))


class EagleHead(nn.Module):
    def __init__(self, h: HeadArgs):
        super().__init__()
        a = h.layer
        self.args = h
        self.fc = Linear(len(h.aux_layers) * h.target_hidden_size, a.hidden_size, bias=False)
        self.embed_tokens = nn.Embedding(a.vocab_size, a.hidden_size)
        self.layers = nn.ModuleList([HeadLayer(h)])
        self.norm = RMSNorm(a.hidden_size, a.rms_norm_eps)
        self.lm_head = Linear(a.hidden_size, h.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(h.draft_vocab_size, dtype=torch.int64))
        self.register_buffer("inv_freq", rope_buffer(a), persistent=False)
        self.flash: attention.FlashKernel | None = None  # set by the engine, as the target's

    def forward(self, batch: Batch, feature: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """feature [B, T, H]: fc(target features) or the head's own previous output; batch's
        tokens are the tokens one position ahead of the features. Returns h [B, T, H] (before
        the final norm: the next step's feature); the batch's KV is now cached."""
        emb = self.embed_tokens(batch.tokens).to(feature.dtype)
        cos, sin = rotation(self.args.layer.rope, self.inv_freq[0], batch.positions, feature.dtype)
        plan = attention.plan(batch, cache, (0,), self.flash)
        return self.layers[0](emb, feature, cos, sin, plan, batch, cache)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """[..., Vd] float32 over the draft vocabulary."""
        return self.lm_head(self.norm(h)).float()

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def target_logits(self, h: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """[..., vocab_size] float32: the draft vocabulary's logits at their target ids, -inf
        elsewhere, so that the target's sampling rules (sampling.probabilities) apply as they
        are and a drafted id is the target's own."""
        d = self.logits(h)
        out = d.new_full((*d.shape[:-1], vocab_size), float("-inf"))
        return out.index_copy_(-1, self.d2t + torch.arange(len(self.d2t), device=d.device), d)
