"""A decoder layer's small work on CUDA in two Triton kernels (triton_kernels.py): the residual
add with the RMSNorm after it, and SiLU(gate) x up. PyTorch runs eight kernels for a norm in
float32 statistics and three for the MLP's middle, at 32 layers about 700 launches a step that
each cost a few microseconds even replayed from a CUDA graph; fused, 96. Each row is one program
with one fixed order of sums, so a row's result never depends on the batch (the exact mode keeps
its guarantee), and the roundings are model.RMSNorm's and MLP's: the result agrees with PyTorch's
operators within a rounding of the dtype.

The same interface as cpu/pointwise.py (the engine attaches one or the other); the CPU tests run
these kernels in Triton's interpreter. `probe` checks them on the device at load, against
PyTorch's operators; where it fails, or triton is missing, the model keeps PyTorch's.
"""
from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MAX_WIDTH = 16384   # one program holds a normalized row: next_power_of_2(width) lanes
SILU_BLOCK = 1024


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8 if block <= 8192 else 16


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
            add: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + add, RMSNorm of it) as model.RMSNorm computes it (Gemma's: gemma); add None: (x,
    RMSNorm(x)). weight in x's dtype."""
    from ..kernels.triton_kernels import add_rmsnorm
    d = x.shape[-1]
    if d > MAX_WIDTH:
        raise ValueError(f"rmsnorm: rows of {d} are past its bound {MAX_WIDTH}")
    x = x.contiguous()
    out = torch.empty_like(x)
    total = x if add is None else torch.empty_like(x)
    rows = x.numel() // d
    if rows:
        block = max(16, 1 << (d - 1).bit_length())
        add_rmsnorm[(rows,)](x, x if add is None else add.contiguous(), weight, total, out, rows,
                             d, eps, HAS_ADD=add is not None, GEMMA=gemma, BD=block,
                             num_warps=_warps(block))
    return total, out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up for gate_up [..., 2 I], gate first: [..., I]."""
    from ..kernels import triton_kernels
    gate_up = gate_up.contiguous()
    i = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], i)
    rows = gate_up.numel() // (2 * i)
    if rows:
        block = min(SILU_BLOCK, max(16, 1 << (i - 1).bit_length()))
        triton_kernels.silu_mul[(rows, -(-i // block))](gate_up, out, rows, i, BI=block,
                                                       num_warps=_warps(block))
    return out


def reference_rmsnorm(x, weight, eps, gemma, add=None):
    """(x + add, its RMSNorm) in PyTorch's operators (model.rms_norm): what `probe` and the
    tests hold the kernel to."""
    from .model import rms_norm
    total = x if add is None else x + add
    return total, rms_norm(total, weight, eps, gemma)


def probe(device: torch.device, dtype: torch.dtype, width: int, inner: int) -> str | None:
    """Why the kernels cannot serve rows of `width` and an MLP of `inner` on `device` in `dtype`
    (None: they can): each against PyTorch within a rounding, and a row computed alone
    bitwise equal to the same row among others."""
    try:
        import triton  # noqa: F401
    except ImportError as e:
        return f"triton is not installed ({e})"
    if dtype not in DTYPES:
        return f"not for {dtype}"
    if width > MAX_WIDTH:
        return f"rows of {width} are past {MAX_WIDTH}"
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, width, generator=gen).to(device, dtype)
    add = torch.randn(5, width, generator=gen).to(device, dtype)
    w = (1 + 0.1 * torch.randn(width, generator=gen)).to(device, dtype)
    gate_up = (2 * torch.randn(5, 2 * inner, generator=gen)).to(device, dtype)
    try:
        total, out = rmsnorm(x, w, 1e-6, False, add)
        ref_total, ref = reference_rmsnorm(x, w, 1e-6, False, add)
        act = silu_mul(gate_up)
        g, u = gate_up.chunk(2, -1)
        if not torch.equal(total, ref_total):
            return "the residual add differs from PyTorch's"
        if not torch.allclose(out.float(), ref.float(), rtol=tol, atol=tol):
            return "RMSNorm differs from PyTorch's"
        if not torch.allclose(act.float(), (F.silu(g) * u).float(), rtol=2 * tol, atol=2 * tol):
            return "SiLU x up differs from PyTorch's"
        if not (torch.equal(rmsnorm(x[2:3], w, 1e-6, False, add[2:3])[1], out[2:3])
                and torch.equal(silu_mul(gate_up[2:3]), act[2:3])):
            return "a row alone differs from the same row in a batch"
    except Exception as e:   # a compiler or driver that cannot run them here
        return f"{type(e).__name__}: {e}"
    return None


def attach(model) -> str | None:
    """Turn on the fused norms and MLP of `model` (a Transformer, on CUDA) where `probe` passes;
    returns why not where it does not (logged), None where they are on."""
    a = model.args
    weight = model.model.norm.weight
    reason = probe(weight.device, weight.dtype, a.hidden_size, a.intermediate_size)
    if reason is not None:
        log.warning("fused pointwise kernels off, PyTorch's operators serve: %s", reason)
        return reason
    import sys
    model.fuse_pointwise(sys.modules[__name__])
    return None
