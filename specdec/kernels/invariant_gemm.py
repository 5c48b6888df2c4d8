"""A row-invariant GEMM for CUDA in 16-bit dtypes: one Triton kernel, one K order for every M.

invariant.linear on CUDA otherwise pads each call's rows to blocks of CUDA_ROWS and runs one
cuBLAS GEMM a block, because cuBLAS picks its kernel (and with it the order of a row's sums) by
M. That costs: on an H100 at Llama-3.1-8B's shapes the exact mode's step was 16.7 ms against
9.3 (docs/benchmarks.md, "On a GPU: NVIDIA H100"), a decode step's M = 1 run as M = 128 with
no split over K. Here the tiling is fixed instead: out[m, n] is the sum over BLOCK_K-wide
slices of K, in order, of one [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tensor-core product
accumulated in float32. A row's arithmetic depends on its own values and the weight only, not on
M or on which block it lands in (the idea of Thinking Machines' batch-invariant kernels); the
rows past M are masked loads. M is not specialized on, so every M runs one compiled kernel of
16-row tiles, or from WIDE_FROM rows one of 64 x 64 tiles on the same instruction (below).

`probe` checks that at load on the device itself, for each weight shape: every row of
_PROBE_ROWS-row calls (and of _WIDE_ROWS-row calls in wide tiles) equal to the same row alone,
bit for bit, and the result close to F.linear's. A weight whose probe fails (or where triton is
missing or does not compile) keeps the cuBLAS blocks, and the log says so. The CPU tests run
the kernel in Triton's interpreter (TRITON_INTERPRET=1), which checks its indexing and masking,
not a GPU's arithmetic.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger("specdec")

# The tiling: part of the arithmetic (another tiling sums in another order), so fixed. A
# decode step's M is 1 to a few dozen rows: 16-row tiles waste little, and the M tiles of one
# N tile run next to each other (program order), so a weight tile read from memory once serves
# all of them from L2. With no split over K, N / BLOCK_N programs stream the weight: 32 columns
# give an 8B model's narrowest layers (N = 4096) 128 of them, about an H100's 132 SMs. Chosen,
# not yet tuned on a GPU (benchmarks/invariance_probe.py times it against cuBLAS).
BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 128
NUM_WARPS, NUM_STAGES = 4, 4
# Calls of WIDE_FROM rows or more (a prompt's prefill, 16 rows' verifications) in 64 x 64 tiles:
# 16-row tiles reuse each weight tile for 16 rows only (about 11 flops a byte from L2), 64 x 64
# ones 32. Same BLOCK_K, the same slices of K in the same order, and two warps a program, which
# keeps Triton on the tensor-core instruction the 16-row tiles use (mma.sync m16n8k16; with a
# warpgroup of four on Hopper it takes wgmma, whose rounding against it is not documented):
# a row's sums are the same instructions over the same values in the same order, so the same
# bits (tests/core/test_triton_compile.py reads the instruction from the PTX). `probe` still
# compares the wide tiles' rows with each row alone and keeps 16-row tiles where they differ.
WIDE_M, WIDE_N, WIDE_FROM, WIDE_WARPS, WIDE_STAGES = 64, 64, 64, 2, 3

_PROBE_ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 33, 64, 65, 129)   # in 16-row tiles
_WIDE_ROWS = (64, 65, 129)
_ready: dict[tuple, bool] = {}   # (device, dtype, shape) -> probed usable
_wide: dict[tuple, bool] = {}    # the same key -> the wide tiles give each row its bits alone
_kernel = None
enabled = True   # False: every weight takes the cuBLAS blocks (benchmarks/costs.py times both)


def _build():
    """The kernel, imported at first use: triton comes with CUDA builds of torch."""
    from .triton_kernels import gemm
    return gemm


def linear(x: torch.Tensor, weight: torch.Tensor, wide: bool | None = None) -> torch.Tensor:
    """x [M, K] @ weight [N, K]^T -> [M, N] in x's dtype, each row's sums in one fixed order.
    wide: 64 x 64 tiles (None: from WIDE_FROM rows, where `probe` found them giving the same
    bits)."""
    global _kernel
    if _kernel is None:
        _kernel = _build()
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    if wide is None:
        wide = m >= WIDE_FROM and _wide.get(_key(weight), False)
    bm, bn, warps, stages = ((WIDE_M, WIDE_N, WIDE_WARPS, WIDE_STAGES) if wide else
                             (BLOCK_M, BLOCK_N, NUM_WARPS, NUM_STAGES))
    m_tiles = -(-m // bm)
    _kernel[(m_tiles * -(-n // bn),)](
        x, weight, out, m, n, k, m_tiles, x.stride(0), x.stride(1), weight.stride(0),
        weight.stride(1), out.stride(0), out.stride(1), BM=bm, BN=bn, BK=BLOCK_K,
        num_warps=warps, num_stages=stages)
    return out


def _key(weight: torch.Tensor) -> tuple:
    return (str(weight.device), weight.dtype, tuple(weight.shape))


def ready(weight: torch.Tensor) -> bool:
    """Whether `probe` found the kernel usable for this weight's device, dtype and shape. Asked
    on every blocked linear call: where nothing was probed (the CPU) no key is built."""
    return enabled and bool(_ready) and _ready.get(_key(weight), False)


def probed() -> dict[str, bool]:
    """What `probe` found, by weight: for benchmarks' records."""
    out = {}
    for (device, dtype, shape), ok in _ready.items():
        name = f"{list(shape)} {str(dtype).removeprefix('torch.')} {device}"
        out[name] = ok
        if ok:
            out[f"{name}, wide tiles"] = _wide.get((device, dtype, shape), False)
    return out


def probe(weight: torch.Tensor) -> bool:
    """At load, before any CUDA graph is captured: whether the kernel gives this weight's shape
    row-invariant results close to F.linear's on its device (cached; logs why not, once); then
    whether the wide tiles give each row the same bits too (else calls keep 16-row tiles)."""
    key = _key(weight)
    if key in _ready:
        return _ready[key]
    wide_why = None
    try:
        gen = torch.Generator().manual_seed(0)
        rows = max(_PROBE_ROWS + _WIDE_ROWS)
        x = torch.randn(rows, weight.shape[1], generator=gen).to(weight)
        with torch.inference_mode():
            alone = torch.cat([linear(x[i:i + 1], weight, False) for i in range(rows)])
            why = next((f"{m} rows differ from each row alone" for m in _PROBE_ROWS
                        if not torch.equal(linear(x[:m], weight, False), alone[:m])), None)
            ref = F.linear(x.float(), weight.float())
            err = (alone.float() - ref).abs().max().item()
            scale = ref.abs().max().item() or 1.0
            if why is None and not err <= 2 ** -6 * scale:
                why = f"max error {err:.3g} against F.linear (of {scale:.3g})"
            if why is None:
                wide_why = next((f"{m} rows in {WIDE_M} x {WIDE_N} tiles differ from each row "
                                 f"alone" for m in _WIDE_ROWS
                                 if not torch.equal(linear(x[:m], weight, True), alone[:m])),
                                None)
    except Exception as exc:   # no triton, no compiler for this device, ...
        why = f"{type(exc).__name__}: {exc}"
    _ready[key] = why is None
    _wide[key] = why is None and wide_why is None
    name = f"{list(weight.shape)} {str(weight.dtype).removeprefix('torch.')} on {weight.device}"
    if why is not None:
        log.warning("specdec: invariant GEMM for %s: %s; its linear layers use cuBLAS over "
                    "fixed row blocks", name, why)
    elif wide_why is not None:
        log.warning("specdec: invariant GEMM for %s: %s; calls of every size use %d-row tiles",
                    name, wide_why, BLOCK_M)
    return _ready[key]
