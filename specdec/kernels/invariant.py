"""Batch-invariant arithmetic: a token's logits computed the same way whatever shares its forward.

Speculative greedy output equals target-only output only if the target scores a token with the
same arithmetic in a K+1-token verification as in a one-token step, beside any rows and padding.
Kernels are chosen by shape, and a different kernel sums in a different order: measured on our
CPUs (PyTorch 2.13), a float32 matmul gives other low bits for a row at M = 1 than at M = 5, and
in bfloat16 the attention of one query differs from the same query among five in about 1 case
of 10 (SDPA). In bfloat16 that flips near-ties: 3-6 of 16 held-out prompts left the target's
greedy text within 128 tokens. The idea is that of batch-invariant kernels (He et al., "Defeating
Nondeterminism in LLM Inference", Thinking Machines 2025), here with PyTorch's own operators:

- Linear layers run over blocks of exactly ROWS rows (the last one padded): every row of every
  forward goes through one GEMM shape, in which a row's sums do not depend on the other rows.
- Attention computes scores and softmax in float32 over keys padded to a multiple of KV_BLOCK,
  the masked keys' weights being exact zeros; each token's heads go to the score GEMM alone,
  and values are summed per KV_BLOCK keys (one GEMM shape) and then across blocks in order, so
  the blocks past a query's own position add exact zeros.
Norms, softmax over the vocabulary and sampling reduce each row alone already.

On CUDA cuBLAS chooses its kernel by the GEMM's M and a bmm's batch count as well (measured on
an H200 at Llama-3.1-8B's shapes: F.linear changed a row's bits at 57-126 of 159 row counts, the
CPU's 16-row bmm from 17 rows on, its per-token attention in 79 of 315 cases), so there every
call keeps one shape. In bfloat16 and float16 that is one Triton kernel of a fixed tiling for
the linear layers (invariant_gemm.py) and one for attention over the KV slots in place
(invariant_attention.py), each probed at load; elsewhere a cuBLAS GEMM per CUDA_ROWS-row block,
and attention calls of exactly ATTN_ROWS rows x ATTN_TOKENS tokens
(benchmarks/invariance_probe.py; docs/exactness.md).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import invariant_attention, invariant_gemm

ROWS = 16       # rows per GEMM on the CPU: a multiple of its kernels' row tiles
CUDA_ROWS = 128  # rows per GEMM on CUDA: a decode batch's tokens (16 rows x K + 1), 1-2 GEMMs
KV_BLOCK = 64   # keys per block of the value sum; keys are padded to a multiple of it
ATTN_ROWS, ATTN_TOKENS = 16, 9   # CUDA: rows and tokens per attention call (a K = 8 round)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """F.linear(x, weight, bias), each row computed in a GEMM of one shape whatever M is: on the
    CPU [ROWS, in] x [in, out] blocks in one bmm; on CUDA invariant_gemm's kernel where `prepare`
    found it usable, else [CUDA_ROWS, in] blocks, a cuBLAS GEMM each."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1])
    if invariant_gemm.ready(weight):   # probed at load (CUDA): one kernel, any M
        out = invariant_gemm.linear(rows, weight)
        if bias is not None:
            out = out + bias
        return out.view(*shape[:-1], weight.shape[0])
    m = rows.shape[0]
    block = CUDA_ROWS if x.device.type == "cuda" else ROWS
    pad = -m % block
    if pad:
        rows = F.pad(rows, (0, 0, 0, pad))
    if x.device.type == "cuda":
        # cuBLAS picks its kernel by the GEMM's shape, a bmm's batch count included, and a
        # bmm reads the weight once per block: separate GEMMs of one shape are invariant, and
        # up to CUDA_ROWS rows a decode step's GEMM is bound by reading the weight, so the
        # padding is nearly free (benchmarks/invariance_probe.py measures both).
        out = _cat([F.linear(b, weight) for b in rows.split(block)], 0)
    else:
        blocks = rows.view(-1, ROWS, shape[-1])                            # [N, ROWS, in]
        # bmm over a stride-0 weight: one call, one GEMM shape per block, no weight copy.
        out = torch.bmm(blocks, weight.t().expand(blocks.shape[0], -1, -1))  # [N, ROWS, out]
        out = out.reshape(-1, weight.shape[0])
    out = out[:m]
    if bias is not None:
        out = out + bias
    return out.view(*shape[:-1], weight.shape[0])


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
              scale: float, softcap: float | None) -> torch.Tensor:
    """q [B, H, T, D]; k, v [B, KV, L, D]; mask [B, 1, T, L] (True: attend). Returns
    [B, H, T, D] in q's dtype. Each token's g = H / KV query heads of one key/value head are
    one [g, D] x [D, L] GEMM, and its value sum [g, KV_BLOCK] x [KV_BLOCK, D] GEMMs: the shapes
    of a token alone, however many tokens and rows the forward holds."""
    if q.device.type == "cuda":
        return _attention_cuda(q, k, v, mask, scale, softcap)
    return _attention_blocks(q, k, v, mask, scale, softcap)


def _attention_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                      scale: float, softcap: float | None) -> torch.Tensor:
    """invariant.attention on the CPU: per-token score GEMMs, values summed per KV_BLOCK."""
    b, h, t, d = q.shape
    kv, length = k.shape[1], k.shape[2]
    g = h // kv
    pad = -length % KV_BLOCK
    if pad:   # zero keys the mask hides, so that blocks are whole
        k, v = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        mask = F.pad(mask, (0, pad))
    n, blocks = length + pad, (length + pad) // KV_BLOCK
    # bmm over contiguous copies: a GEMM's order depends on its operands' layouts as well as
    # its shape (a transposed view takes another kernel), and torch.matmul folds broadcast
    # batch dimensions into the rows for some layouts.
    rows = q.reshape(b, kv, g, t, d).transpose(2, 3).float().reshape(-1, g, d).contiguous()
    keys = k.float()[:, :, None].expand(b, kv, t, n, d).reshape(-1, n, d).contiguous()
    scores = torch.bmm(rows, keys.transpose(1, 2)).view(b, kv, t, g, n) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~mask[:, :, :, None], float("-inf"))
    p = scores.softmax(-1).view(b, kv, t, g, blocks, KV_BLOCK).transpose(3, 4)
    values = v.float().view(b, kv, 1, blocks, KV_BLOCK, d).expand(b, kv, t, blocks, KV_BLOCK, d)
    parts = torch.bmm(p.reshape(-1, g, KV_BLOCK).contiguous(),
                      values.reshape(-1, KV_BLOCK, d).contiguous())
    out = _sum_in_order(parts.view(b * kv * t, blocks, g, d))                # [BKVT, g, D]
    return out.view(b, kv, t, g, d).permute(0, 1, 3, 2, 4).reshape(b, h, t, d).to(q.dtype)


def _attention_cuda(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float, softcap: float | None) -> torch.Tensor:
    """invariant.attention on CUDA: calls of exactly ATTN_ROWS rows x ATTN_TOKENS tokens (each
    padded), per row and key/value head one [ATTN_TOKENS g, D] x [D, L] score GEMM and one
    [ATTN_TOKENS g, L] x [L, D] value GEMM, in float32. cuBLAS chooses its kernel by the batch
    count and M, which then never change; on an H200 this kept every query's bits alone,
    beside others, and over 64 or 128 masked keys more (benchmarks/invariance_probe.py),
    where the CPU's per-token GEMMs did not."""
    b, t = q.shape[0], q.shape[2]
    return _cat([_cat([_attention_call(q[r:r + ATTN_ROWS, :, i:i + ATTN_TOKENS],
                                       k[r:r + ATTN_ROWS], v[r:r + ATTN_ROWS],
                                       mask[r:r + ATTN_ROWS, :, i:i + ATTN_TOKENS], scale,
                                       softcap)
                       for i in range(0, t, ATTN_TOKENS)], 2)
                 for r in range(0, b, ATTN_ROWS)], 0)


def _attention_call(q, k, v, mask, scale: float, softcap: float | None, rows: int = ATTN_ROWS,
                    tokens: int = ATTN_TOKENS) -> torch.Tensor:
    """One call of at most `rows` rows x `tokens` tokens, padded to exactly that."""
    b, h, t, d = q.shape
    kv, length = k.shape[1], k.shape[2]
    g = h // kv
    pb, pt = rows - b, tokens - t
    q = F.pad(q, (0, 0, 0, pt, 0, 0, 0, pb))
    mask = F.pad(mask, (0, 0, 0, pt, 0, 0, 0, pb))
    k, v = F.pad(k, (0, 0, 0, 0, 0, 0, 0, pb)), F.pad(v, (0, 0, 0, 0, 0, 0, 0, pb))
    queries = q.view(rows, kv, g, tokens, d).transpose(2, 3).float() \
        .reshape(rows * kv, tokens * g, d)                                  # [R KV, T g, D]
    keys = k.float().reshape(rows * kv, length, d)
    scores = torch.bmm(queries, keys.transpose(1, 2)) * scale               # [R KV, T g, L]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(rows, kv, tokens, g, length)
    # A padded token masks every key: its softmax is NaN, in rows that are then dropped.
    scores = scores.masked_fill(~mask[:, :, :, None], float("-inf"))
    p = scores.softmax(-1).view(rows * kv, tokens * g, length)
    out = torch.bmm(p, v.float().reshape(rows * kv, length, d))             # [R KV, T g, D]
    out = out.view(rows, kv, tokens, g, d).permute(0, 1, 3, 2, 4)
    return out.reshape(rows, h, tokens, d)[:b, :, :t].to(q.dtype)


def _cat(parts: list[torch.Tensor], dim: int) -> torch.Tensor:
    """torch.cat, without the copy when there is one part (a decode step's usual case)."""
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def _sum_in_order(parts: torch.Tensor) -> torch.Tensor:
    """parts [X, blocks, ...] summed over blocks left to right, so trailing zero blocks change
    nothing. The CPU's cumsum is that loop (accumulating in float64); CUDA's is a parallel scan
    whose association depends on the length, so there the loop is written out."""
    if parts.device.type == "cpu":
        return parts.cumsum(1)[:, -1].float()
    out = parts[:, 0]
    for j in range(1, parts.shape[1]):
        out = out + parts[:, j]
    return out


def _kernels_for(device: torch.device, dtype: torch.dtype) -> bool:
    return device.type == "cuda" and dtype in (torch.bfloat16, torch.float16)


def prepare(weight: torch.Tensor) -> None:
    """At load, before CUDA graphs: on CUDA in 16-bit dtypes, probe invariant_gemm's kernel at
    this weight's shape (`linear` uses it where the probe passed)."""
    if _kernels_for(weight.device, weight.dtype):
        invariant_gemm.probe(weight)


def prepare_attention(kv: int, g: int, d: int, dtype: torch.dtype, device: torch.device,
                      softcap: float | None) -> None:
    """The same for invariant_attention's kernel (attention.attend uses it where it passed)."""
    if _kernels_for(device, dtype):
        invariant_attention.probe(kv, g, d, dtype, device, softcap)


# Row counts a forward may give a linear layer, probed at load (kernels switch on small M).
_PROBE_ROWS = (2, 3, 5, 8, 9, 16, 17, 33, 64, 65, 129)
_probed: dict[tuple, bool] = {}


def plain_linear_is_invariant(weight: torch.Tensor) -> bool:
    """Whether F.linear at this weight's shape, dtype and device gives every row the bits it
    gets alone, at each of _PROBE_ROWS rows (some CPU kernels do: bfloat16 without AMX sums
    each output in one order). Then the blocks are pure cost and `linear` is not needed."""
    if weight.device.type == "cuda":
        return False   # cuBLAS chooses its kernel by M, and no probe covers every M
    key = (weight.device.type, weight.dtype, tuple(weight.shape))
    if key not in _probed:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(max(_PROBE_ROWS), weight.shape[1], generator=gen).to(weight)
        with torch.inference_mode():
            alone = torch.cat([F.linear(x[i:i + 1], weight) for i in range(len(x))])
            _probed[key] = all(torch.equal(F.linear(x[:m], weight), alone[:m])
                               for m in _PROBE_ROWS)
    return _probed[key]
