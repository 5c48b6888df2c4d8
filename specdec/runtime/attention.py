"""Attention over the KV slot pool, by one of three kernels chosen once per forward.

- PyTorch SDPA (every device): the batch's keys and values are written into the pool, then
  read back as [B, kv_len] (a view for consecutive slots, else a gather) under a boolean mask.
- flash-attn's `flash_attn_with_kvcache` (CUDA, fp16/bf16, when the package is installed): one
  kernel appends the new keys and values at each row's cached length and attends over the slot
  in place (`cache_batch_idx`), so nothing is gathered and the shapes do not depend on lengths.
- The CPU's own (cpu/attention.c; float32/bfloat16, where the CPU kernels built): the keys and
  values written, then each query over its slot's keys in place, no mask, each query's bits its
  own (so also the exact mode's attention on the CPU).

Both read and write the same pool, so one model may use either for any forward. flash-attn
appends all T tokens of a row from its first position: a ragged row's padding lands in its own
slot past its real tokens (never read: a later write replaces it), so it is used only when every
row's T tokens fit in max_len; otherwise that forward takes SDPA.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..kernels import invariant, invariant_attention
from .batch import Batch
from ..kernels.cpu import attention as cpu_attention
from .kv_cache import KVCache

FlashKernel = Callable[..., torch.Tensor]


def find_flash_kernel() -> FlashKernel | None:
    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        return None
    return flash_attn_with_kvcache


def flash_usable(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


@dataclass
class Plan:
    """How one forward attends; computed once, used by every layer. Windows are keyed by size
    (0: a global layer); a window of w keys lets a query see itself and the w - 1 before it."""
    flash: FlashKernel | None = None      # flash-attn's kernel, or None: SDPA
    masks: dict[int, torch.Tensor] | None = None  # SDPA: window -> [B, 1, T, L] keys a query sees
    seqlens: torch.Tensor | None = None   # flash: [B] int32 tokens cached before this forward
    slots: torch.Tensor | None = None     # flash: [B] int32 slot of each row
    invariant: bool = False               # invariant.attention in place of SDPA
    # The CPU's kernel: per token int64, the slot it is written to, its position and the slot it
    # reads: [B T], or [N] for the real tokens `real` indexes in [B T] (batch.real).
    cpu: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
    real: torch.Tensor | None = None


def plan(batch: Batch, cache: KVCache, windows: tuple[int, ...],
         flash: FlashKernel | None, batch_invariant: bool = False, cpu: bool = False) -> Plan:
    """windows: the model's layers' windows (0: global). Each row's run of positions starts at
    its cached length; batch.max_end bounds where flash-attn would write. batch_invariant:
    every query attends as it would alone (invariant.py), never by flash-attn. cpu: the CPU's
    kernel (the engine sets it where it is usable), invariant whatever batch_invariant says."""
    positions = batch.positions                                             # [B, T]
    if cpu:
        b, t = positions.shape
        per_token = (batch.write_slots.reshape(-1), positions.reshape(-1),
                     batch.read_slots[:, None].expand(b, t).reshape(-1))
        if batch.real is not None:
            per_token = tuple(x[batch.real] for x in per_token)
        return Plan(cpu=tuple(x.contiguous() for x in per_token), real=batch.real)
    if flash is not None and not batch_invariant and batch.max_end <= cache.max_len:
        return Plan(flash=flash, seqlens=positions[:, 0].to(torch.int32),
                    slots=batch.read_slots.to(torch.int32))
    keys = torch.arange(batch.kv_len, device=positions.device)
    pos = positions[:, None, :, None]                                       # [B, 1, T, 1]
    causal = keys <= pos                                                    # [B, 1, T, L]
    return Plan(masks={w: causal & (keys > pos - w) if w else causal for w in windows},
                invariant=batch_invariant)


def attend(p: Plan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
           batch: Batch, cache: KVCache, window: int = 0, scale: float | None = None,
           softcap: float | None = None,
           rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [B, T, H, D], k and v [B, T, KV, D] (rotated, but on the CPU's kernel, which rotates
    them by rotary's (cos, sin)); returns [B, T, H, D]. scale: the queries' (None: D ** -0.5);
    softcap: scores become softcap * tanh(score / softcap)."""
    if p.cpu is not None:
        return cpu_attention.attend(q, k, v, cache.k[layer], cache.v[layer], *p.cpu, window,
                                    scale or q.shape[-1] ** -0.5, softcap, rotary)
    if p.flash is not None:
        extra = {} if softcap is None else {"softcap": softcap}   # flash-attn >= 2.6
        return p.flash(q, cache.k[layer], cache.v[layer], k=k, v=v, cache_seqlens=p.seqlens,
                       cache_batch_idx=p.slots, causal=True, softmax_scale=scale,
                       window_size=(window - 1, 0) if window else (-1, -1), **extra)
    cache.write(layer, batch.write_slots, batch.positions, k, v)
    if p.invariant and invariant_attention.ready(q, cache.k[layer], softcap):   # in place
        return invariant_attention.attend(q, cache.k[layer], cache.v[layer], batch.read_slots,
                                          batch.positions, window,
                                          scale or q.shape[-1] ** -0.5, softcap)
    keys, values = cache.read(layer, batch.read_slots, batch.kv_len,
                              batch.first_slot)                             # [B, L, KV, D]
    q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
    mask = p.masks[window]
    if p.invariant:
        out = invariant.attention(q, keys, values, mask, scale or q.shape[-1] ** -0.5, softcap)
    elif softcap is None:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                             enable_gqa=q.shape[1] != keys.shape[1])
    else:
        out = capped_attention(q, keys, values, mask, scale or q.shape[-1] ** -0.5, softcap)
    return out.transpose(1, 2)                                              # [B, T, H, D]


def capped_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                     scale: float, softcap: float) -> torch.Tensor:
    """Gemma 2's attention, which SDPA cannot express: q [B, H, T, D], k, v [B, KV, L, D],
    mask [B, 1, T, L]; the capped scores softmaxed in float32."""
    if q.shape[1] != k.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], 1)
    scores = torch.tanh((q @ k.transpose(-1, -2)) * (scale / softcap)) * softcap
    scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(-1, dtype=torch.float32).to(q.dtype) @ v


def choose(kind: str, device: torch.device, dtype: torch.dtype) -> FlashKernel | None:
    """kind: "auto" (flash-attn where usable and installed), "sdpa" or "flash" (required)."""
    if kind not in ("auto", "sdpa", "flash"):
        raise ValueError(f"attention {kind!r}: expected auto, sdpa or flash")
    if kind == "sdpa":
        return None
    kernel = find_flash_kernel() if flash_usable(device, dtype) else None
    if kind == "flash" and kernel is None:
        raise ValueError(f"attention flash needs CUDA with float16 or bfloat16 and the flash-attn "
                         f"package; have {device.type} {str(dtype).removeprefix('torch.')}, "
                         f"flash-attn {'installed' if find_flash_kernel() else 'not installed'}")
    return kernel
