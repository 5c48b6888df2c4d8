"""One decoder for every supported family, used by draft and target alike.

The Llama block (Touvron et al. 2023; RoPE, Su et al. 2021; grouped-query attention, Ainslie et
al. 2023) with the variations config.py reads: q/k norms (Qwen3, Gemma 3), Gemma's scaled
embeddings, (1 + w) norms around attention and MLP and soft-capped scores and logits (Gemma 2),
sliding-window layers beside global ones with their own RoPE base (Gemma 2/3), partial rotary
dims and LongRoPE (Phi-3/4), YaRN, GELU. Module attribute names follow Hugging Face's, except
that q/k/v and gate/up are one matrix each (`FUSED`; weights.py concatenates them at load, Phi-3
stores them so): one matmul in place of three, and on the CPU and at batch 1 every operator call
costs about as much as its arithmetic.

Every forward is ragged: row b appends its tokens at its own positions into its own KV slot, so
a batch mixes prefills, K+1-token verifications and single draft steps.
"""
from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from . import attention
from ..kernels import invariant
from .batch import Batch
from ..kernels.cpu import linear as cpu_linear
from .config import ModelArgs, Rope
from .kv_cache import KVCache
from .tensor_parallel.parallel import Shard


def inverse_frequencies(rope: Rope, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE's inverse frequencies [dim / 2] for positions below rope.original_max_position and
    for positions from there on: one tensor twice but for longrope (Phi-3's short and long
    factors). Linear, Llama 3.1 and YaRN scaling as transformers defines them."""
    base = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim)
    inv = 1.0 / base
    if rope.type == "linear":
        inv = inv / rope.factor
    elif rope.type == "llama3":
        low_wavelen = rope.original_max_position / rope.low_freq_factor
        high_wavelen = rope.original_max_position / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv = torch.where(medium, smoothed, scaled)
    elif rope.type == "yarn":
        # Dimensions that turn fewer than beta_slow times over the pretraining length are
        # interpolated (divided by factor), more than beta_fast times kept, a ramp between.
        def dim_at(turns: float) -> float:
            return dim * math.log(rope.original_max_position / (turns * 2 * math.pi)) / (
                2 * math.log(rope.theta))
        low, high = dim_at(rope.beta_fast), dim_at(rope.beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low)
                / (high - low if high != low else 0.001)).clamp(0, 1)
        inv = inv / rope.factor * ramp + inv * (1 - ramp)
    elif rope.type == "longrope":
        return (1.0 / (torch.tensor(rope.short_factor) * base),
                1.0 / (torch.tensor(rope.long_factor) * base))
    return inv, inv


def rope_table(args: ModelArgs) -> torch.Tensor:
    """[ropes, 2, rotary_dim / 2]: inverse_frequencies of args.rope (and args.local_rope)."""
    dim = args.rotary_dim or args.head_dim
    return torch.stack([torch.stack(inverse_frequencies(r, dim)) for r in args.ropes])


def rope_buffer(args: ModelArgs) -> torch.Tensor:
    """rope_table on the default device, computed on the CPU: on meta (on_meta) its operators
    would import torch's decompositions, 2 s of CPU the first time in a process."""
    with torch.device("cpu"):
        table = rope_table(args)
    return table.to(torch.get_default_device())


# Checkpoint tensors that are one tensor here, concatenated along the output dimension in order.
FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
         "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}


def rotation(rope: Rope, inv_freq: torch.Tensor, positions: torch.Tensor,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, 1, R] of `rope` (inv_freq: its rope_table row [2, R / 2]) at positions
    [B, T]. Longrope takes its long factors at positions from original_max_position on, each
    position on its own, so that a token's keys are the same however the sequence was cut into
    forwards (transformers switches a whole forward by its last position)."""
    short, long = inv_freq
    pos = positions[..., None].float()                                       # [B, T, 1]
    inv = torch.where(pos >= rope.original_max_position, long, short) \
        if rope.type == "longrope" else short
    freqs = pos * inv                                                        # [B, T, R/2]
    cos = torch.cat((freqs, freqs), dim=-1).cos()[:, :, None, :]              # [B, T, 1, R]
    half = freqs.sin()
    sin = torch.cat((-half, half), dim=-1)[:, :, None, :]                     # rotate's sign
    if rope.attention_factor != 1.0:
        cos, sin = cos * rope.attention_factor, sin * rope.attention_factor
    return cos.to(dtype), sin.to(dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, 1, R], sin negated in its first half (Hugging Face's
    half-split layout: x * cos + cat(-x2, x1) * sin, with the sign moved into sin). Only the
    first R dims rotate (R < D: Phi's partial rotary factor)."""
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + x.roll(r // 2, -1) * sin
    head = x[..., :r]
    return torch.cat((head * cos + head.roll(r // 2, -1) * sin, x[..., r:]), -1)


@contextmanager
def on_meta():
    """Build modules on the meta device, shapes only, for a checkpoint's tensors to replace.
    Without nn.Embedding's random init: normal_ has no C++ meta kernel, and its Python one
    imports torch's decompositions, 2.7 s of CPU the first time in a process (every model
    process of a starting server paid it; rope_buffer keeps RoPE's table off meta too)."""
    init = nn.Embedding.reset_parameters
    nn.Embedding.reset_parameters = lambda self: None
    try:
        with torch.device("meta"):
            yield
    finally:
        nn.Embedding.reset_parameters = init


class Linear(nn.Linear):
    """nn.Linear; `packed` (cpu/linear.py's pack_model, on the CPU): the weight packed for the
    CPU's kernel, whose rows are batch-invariant; `blocked` (set by
    Transformer.make_batch_invariant): over fixed row blocks."""
    blocked = False
    packed: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return cpu_linear.linear(x, self.packed, self.out_features, self.bias)
        if self.blocked:
            return invariant.linear(x, self.weight, self.bias)
        return super().forward(x)


class RMSNorm(nn.Module):
    """Llama's (w times the normalized x cast back), or Gemma's (x (1 + w), all in float32).
    `fused` (set by the engine): cpu/pointwise.py or gpu_pointwise.py, whose one kernel call
    computes it."""
    fused = None

    def __init__(self, dim: int, eps: float, gemma: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim) if gemma else torch.ones(dim))
        self.eps, self.gemma = eps, gemma

    def add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + residual, this norm of it)."""
        if self.fused is not None:
            return self.fused.rmsnorm(x, self.weight, self.eps, self.gemma, residual)
        x = x + residual
        return x, self(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            return self.fused.rmsnorm(x, self.weight, self.eps, self.gemma)[1]
        return rms_norm(x, self.weight, self.eps, self.gemma)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """RMSNorm in PyTorch's operators, statistics in float32: Llama's w times the normalized x
    cast back, or Gemma's x (1 + w) cast once. What the fused kernels are held to."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:
        return (h * (1.0 + weight.float())).to(x.dtype)
    return weight * h.to(x.dtype)


class Attention(nn.Module):
    """args: this rank's (heads of its shard, parallel.local_args); tp: the shard whose partial
    o_proj sums one all_reduce adds up, or None."""

    def __init__(self, args: ModelArgs, layer: int, tp: Shard | None = None):
        super().__init__()
        self.layer, self.args, self.tp = layer, args, tp
        h, kv, d = args.num_heads, args.num_kv_heads, args.head_dim
        self.qkv_proj = Linear(args.hidden_size, (h + 2 * kv) * d, bias=args.qkv_bias)
        self.o_proj = Linear(h * d, args.hidden_size, bias=args.o_bias)
        if args.qk_norm:   # over each head, before RoPE
            self.q_norm = RMSNorm(d, args.rms_norm_eps, args.gemma_norms)
            self.k_norm = RMSNorm(d, args.rms_norm_eps, args.gemma_norms)
        self.window = args.window(layer) or 0   # 0: global
        self.scale = args.attn_scale or d ** -0.5

    def forward(self, x, cos, sin, plan: attention.Plan, batch: Batch,
                cache: KVCache) -> torch.Tensor:
        b, t, _ = x.shape
        if plan.cpu is not None:   # the CPU's kernel rotates q and k as it reads and writes them
            q, k, v = self.project(x)
            out = attention.attend(plan, q, k, v, self.layer, batch, cache, self.window,
                                   self.scale, self.args.attn_softcap, (cos, sin))
        else:
            q, k, v = self.project(x, cos, sin)
            out = attention.attend(plan, q, k, v, self.layer, batch, cache, self.window,
                                   self.scale, self.args.attn_softcap)
        out = self.o_proj(out.reshape(b, t, -1))
        return out if self.tp is None else self.tp.all_reduce(out)

    def project(self, x, cos=None, sin=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, T, H, D], k and v [B, T, KV, D]: what attention reads, rotated by (cos, sin)
        where given."""
        b, t, _ = x.shape
        h, kv = self.args.num_heads, self.args.num_kv_heads
        qkv = self.qkv_proj(x).view(b, t, h + 2 * kv, self.args.head_dim)
        qk = qkv[:, :, : h + kv]
        if self.args.qk_norm:
            qk = torch.cat((self.q_norm(qk[:, :, :h]), self.k_norm(qk[:, :, h:])), 2)
        if cos is not None:
            qk = rotate(qk, cos, sin)                                         # [B, T, H+KV, D]
        return qk[:, :, :h], qk[:, :, h:], qkv[:, :, h + kv:]


class MLP(nn.Module):
    fused = None   # SiLU x up by cpu/pointwise.py or gpu_pointwise.py; set by the engine

    def __init__(self, args: ModelArgs, tp: Shard | None = None):
        super().__init__()
        self.tp = tp
        self.gate_up_proj = Linear(args.hidden_size, 2 * args.intermediate_size, bias=False)
        self.down_proj = Linear(args.intermediate_size, args.hidden_size, bias=False)
        self.gelu = args.activation == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused is not None:
            out = self.down_proj(self.fused.silu_mul(self.gate_up_proj(x)))
            return out if self.tp is None else self.tp.all_reduce(out)
        gate, up = self.gate_up_proj(x).chunk(2, -1)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        out = self.down_proj(act * up)
        return out if self.tp is None else self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    """Pre-norm attention and MLP; Gemma also normalizes each one's output before the residual
    add (its post_attention_layernorm is that, and pre_feedforward_layernorm the MLP's input)."""

    def __init__(self, args: ModelArgs, layer: int, tp: Shard | None = None):
        super().__init__()
        self.self_attn = Attention(args, layer, tp)
        self.mlp = MLP(args, tp)
        self.rope = args.layer_rope(layer)
        dim, eps, gemma = args.hidden_size, args.rms_norm_eps, args.gemma_norms
        self.input_layernorm = RMSNorm(dim, eps, gemma)
        self.post_attention_layernorm = RMSNorm(dim, eps, gemma)
        self.sandwich = gemma
        if gemma:
            self.pre_feedforward_layernorm = RMSNorm(dim, eps, gemma)
            self.post_feedforward_layernorm = RMSNorm(dim, eps, gemma)

    def forward(self, x, cos, sin, plan, batch: Batch, cache: KVCache) -> torch.Tensor:
        attn = self.self_attn(self.input_layernorm(x), cos, sin, plan, batch, cache)
        if not self.sandwich:
            x, h = self.post_attention_layernorm.add(x, attn)
            return x + self.mlp(h)
        x = x + self.post_attention_layernorm(attn)
        return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))


class VocabEmbedding(nn.Embedding):
    """Rank tp.rank's `rows` vocabulary rows from tp.rank * rows on; other ids embed as zeros
    here and as their row on the rank that holds it, and one all_reduce adds them: exact."""

    def __init__(self, rows: int, dim: int, tp: Shard):
        super().__init__(rows, dim)
        self.tp = tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.tp.rank * self.num_embeddings
        outside = (local < 0) | (local >= self.num_embeddings)
        x = F.embedding(local.clamp(0, self.num_embeddings - 1), self.weight)
        return self.tp.all_reduce(x.masked_fill(outside[..., None], 0))


class Backbone(nn.Module):
    def __init__(self, args: ModelArgs, tp: Shard | None = None):
        super().__init__()
        if tp is None:
            self.embed_tokens = nn.Embedding(args.vocab_size, args.hidden_size)
        else:
            self.embed_tokens = VocabEmbedding(vocab_rows(args, tp), args.hidden_size, tp)
        self.layers = nn.ModuleList(DecoderLayer(args, i, tp) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps, args.gemma_norms)


def vocab_rows(args: ModelArgs, tp: Shard | None) -> int:
    """Vocabulary rows of the embedding and LM head on one rank: ceil(V / world)."""
    return args.vocab_size if tp is None else -(-args.vocab_size // tp.world)


class Transformer(nn.Module):
    """tp: tensor parallelism (parallel.py): args are then the rank's own (local_args), whose
    vocab_size is still the checkpoint's; the embedding and LM head hold the rank's rows."""

    def __init__(self, args: ModelArgs, tp: Shard | None = None):
        super().__init__()
        self.args, self.tp = args, tp
        self.model = Backbone(args, tp)
        self.lm_head = Linear(args.hidden_size, vocab_rows(args, tp), bias=False)
        self.register_buffer("inv_freq", rope_buffer(args), persistent=False)
        self.windows = tuple(sorted({args.window(i) or 0 for i in range(args.num_layers)}))
        self.flash: attention.FlashKernel | None = None  # set by the engine (CUDA, fp16/bf16)
        self.cpu_attention = False   # the CPU's kernel (cpu/attention.py); set by the engine
        # Layers whose outputs (residual stream, before the next layer) forward also returns:
        # an EAGLE-3 head's features (eagle/). Set by the engine that serves the head.
        self.capture: tuple[int, ...] = ()
        self.invariant = False   # make_batch_invariant

    def fuse_pointwise(self, backend) -> None:
        """Each norm and SiLU x up that `backend` (cpu/pointwise.py, gpu_pointwise.py: rmsnorm,
        silu_mul, DTYPES, MAX_WIDTH) can compute goes through its one kernel call."""
        for m in self.modules():
            if isinstance(m, RMSNorm) and m.weight.dtype in backend.DTYPES \
                    and m.weight.shape[0] <= backend.MAX_WIDTH:
                m.fused = backend
            elif isinstance(m, MLP) and not m.gelu:
                m.fused = backend

    def make_batch_invariant(self) -> None:
        """Score every token with the same arithmetic whatever its forward holds (invariant.py):
        attention by invariant.attention, and each linear layer over fixed row blocks unless
        this device's own kernel is shown row-invariant at its shape; on CUDA in 16-bit dtypes
        the Triton kernels where their probes pass."""
        self.invariant = True
        for m in self.modules():
            if isinstance(m, Linear) and m.packed is None:
                m.blocked = not invariant.plain_linear_is_invariant(m.weight)
                if m.blocked:
                    invariant.prepare(m.weight)
            elif isinstance(m, Attention):
                a, w = m.args, self.lm_head.weight   # o_proj's may be packed (cpu/)
                invariant.prepare_attention(a.num_kv_heads, a.num_heads // a.num_kv_heads,
                                            a.head_dim, w.dtype, w.device, a.attn_softcap)

    def tie_weights(self) -> None:
        if self.args.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        """Hidden states [B, T, hidden] after the final norm; the batch's KV is now cached.
        With `capture`, [B, T, hidden * (1 + len(capture))]: the captured layers' outputs
        follow, in the order capture names them (one tensor: a CUDA graph has one output)."""
        plan = attention.plan(batch, cache, self.windows, self.flash, self.invariant,
                              self.cpu_attention)
        return self.run(self.model.layers, batch, cache, plan, self.capture)

    def run(self, layers, batch: Batch, cache: KVCache, plan: attention.Plan,
            capture: tuple[int, ...] = ()) -> torch.Tensor:
        """Embed, `layers` (this model's, or some of them: swift.SkipView), the final norm.
        On the CPU's kernels (plan.real) the batch's real tokens run as one row [1, N], padding
        dropped, and come back to their places in [B, T] (zeros at padding)."""
        tokens, positions = batch.tokens, batch.positions
        if plan.real is not None:
            tokens = tokens.reshape(-1)[plan.real][None]                           # [1, N]
            positions = positions.reshape(-1)[plan.real][None]
        x = self.model.embed_tokens(tokens)
        if self.args.embed_scale:   # rounded to the weights' dtype first, as Gemma does
            x = x * torch.tensor(self.args.hidden_size ** 0.5, dtype=x.dtype)
        rotations = [rotation(self.args.ropes[r], self.inv_freq[r], positions, x.dtype)
                     for r in range(len(self.inv_freq))]
        captured = {}
        for i, layer in enumerate(layers):
            x = layer(x, *rotations[layer.rope], plan, batch, cache)
            if i in capture:
                captured[i] = x
        x = self.model.norm(x)
        if capture:
            x = torch.cat([x] + [captured[i] for i in capture], -1)
        if plan.real is None:
            return x
        b, t = batch.tokens.shape
        full = x.new_zeros(b * t, x.shape[-1])
        full[plan.real] = x[0]
        return full.view(b, t, -1)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)
        if self.tp is not None:   # every rank gets the full logits
            logits = self.tp.gather_last(logits, self.args.vocab_size)
        logits = logits.float()
        cap = self.args.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap
