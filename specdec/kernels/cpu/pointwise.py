"""A decoder layer's small work on the CPU by pointwise.c: the residual add with the RMSNorm after
it, and SiLU(gate) x up, one call each where PyTorch ran eight operators for a norm and three for
the MLP's middle (benchmarks/step_profile.py: norms 2.7 ms and the layers' elementwise work 3.7
ms of a 25 ms float32 step at batch 1, smollm2-135m, 1795 operators a step)."""
from __future__ import annotations

import ctypes

import torch

DTYPES = (torch.float32, torch.bfloat16)
MAX_WIDTH = 16384    # pointwise.c's bound on a normalized row
_norm: dict[torch.dtype, ctypes._CFuncPtr] = {}
_silu: dict[torch.dtype, ctypes._CFuncPtr] = {}


def declare(lib: ctypes.CDLL) -> None:
    p, n = ctypes.c_void_p, ctypes.c_long
    for suffix, dtype in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        norm = getattr(lib, f"rmsnorm_{suffix}")
        norm.argtypes = [p, p, p, n, n, ctypes.c_float, ctypes.c_int, p, p]
        norm.restype = ctypes.c_int
        silu = getattr(lib, f"silu_mul_{suffix}")
        silu.argtypes = [p, n, n, p]
        silu.restype = ctypes.c_int
        _norm[dtype], _silu[dtype] = norm, silu


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool,
            add: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + add, RMSNorm of it) as model.RMSNorm computes it (Gemma's: gemma), add None: (x,
    RMSNorm(x)). weight in x's dtype."""
    d = x.shape[-1]
    if d > MAX_WIDTH:
        raise ValueError(f"rmsnorm: rows of {d} are past its bound {MAX_WIDTH}")
    if not x.is_contiguous():
        x = x.contiguous()
    out = torch.empty_like(x)
    total = x
    if add is not None:
        if not add.is_contiguous():
            add = add.contiguous()
        total = torch.empty_like(x)
    _norm[x.dtype](x.data_ptr(), None if add is None else add.data_ptr(), weight.data_ptr(),
                   x.numel() // d, d, eps, int(gemma), total.data_ptr(), out.data_ptr())
    return total, out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) x up for gate_up [..., 2 I], gate first: [..., I]."""
    if not gate_up.is_contiguous():
        gate_up = gate_up.contiguous()
    i = gate_up.shape[-1] // 2
    out = torch.empty(*gate_up.shape[:-1], i, dtype=gate_up.dtype)
    _silu[gate_up.dtype](gate_up.data_ptr(), gate_up.numel() // (2 * i), i, out.data_ptr())
    return out


def check(lib: ctypes.CDLL) -> None:
    """Refuse a build that computes wrongly here: both against PyTorch's operators, within a
    rounding of the dtype, odd widths and Gemma's norm included."""
    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        for d, gemma in ((37, False), (64, True)):
            x = torch.randn(3, d, generator=gen).to(dtype)
            add = torch.randn(3, d, generator=gen).to(dtype)
            w = (torch.randn(d, generator=gen) * 0.1 + (0 if gemma else 1)).to(dtype)
            total, out = rmsnorm(x, w, 1e-6, gemma, add)
            s = (x + add).float()
            h = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6)
            ref = h * (1 + w.float()) if gemma else w.float() * h
            if not (torch.equal(total, x + add)
                    and torch.allclose(out.float(), ref, rtol=tol, atol=tol)):
                raise RuntimeError(f"the built RMSNorm kernel computes wrongly in {dtype} here")
        gate_up = (torch.randn(2, 2 * 40, generator=gen) * 4).to(dtype)
        gate, up = gate_up.float().chunk(2, -1)
        if not torch.allclose(silu_mul(gate_up).float(), torch.nn.functional.silu(gate) * up,
                              rtol=tol * 4, atol=tol * 4):
            raise RuntimeError(f"the built SiLU kernel computes wrongly in {dtype} here")
