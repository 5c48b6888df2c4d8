"""y = x W^T on the CPU by linear.c, over weights packed once at load.

Measured on a 2-core AMD EPYC (AVX-512), one thread, float32, a [196608, 576] weight: F.linear
read it at 11 GB/s at one row and 4-7 GB/s at 2-4 rows, oneDNN with a prepacked weight at
13-21 GB/s, this kernel at 29-32 GB/s, where a plain sum reads 30; at 16 and more rows it runs at
the core's arithmetic rate, as oneDNN does. bfloat16 on a CPU with AVX512_BF16 (which that EPYC
has, though its /proc/cpuinfo does not list it) takes two products an instruction.
"""
from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

TILE = 64                    # output columns per packed tile (linear.c)
DTYPES = (torch.float32, torch.bfloat16)
_fn: dict[torch.dtype, ctypes._CFuncPtr] = {}
_pairs = [False]   # bfloat16 packed by pairs of k (linear.c, AVX512_BF16)


def declare(lib: ctypes.CDLL) -> None:
    p, n = ctypes.c_void_p, ctypes.c_long
    for name, dtype in (("linear_f32", torch.float32), ("linear_bf16", torch.bfloat16)):
        fn = getattr(lib, name)
        fn.argtypes = [p, n, n, p, n, p]
        fn.restype = ctypes.c_int
        _fn[dtype] = fn
    lib.linear_bf16_pairs.restype = ctypes.c_int
    _pairs[0] = bool(lib.linear_bf16_pairs())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / 64), K, 64]: tile t holds rows 64 t .. 64 t + 63 transposed,
    zero past N. bfloat16 where the kernel takes pairs of k: [ceil(N / 64), ceil(K / 2), 64, 2],
    k-pair j of tile t holding (W[c, 2j], W[c, 2j + 1]) of each of its columns c (zero past K)."""
    n, k = weight.shape
    tiles = -(-n // TILE)
    if weight.dtype == torch.bfloat16 and _pairs[0]:
        k2 = -(-k // 2)
        padded = F.pad(weight.detach(), (0, 2 * k2 - k, 0, tiles * TILE - n))
        packed = padded.view(tiles, TILE, k2, 2).transpose(1, 2).contiguous()
    else:
        padded = F.pad(weight.detach(), (0, 0, 0, tiles * TILE - n))
        packed = padded.view(tiles, TILE, k).transpose(1, 2).contiguous()
    if packed.data_ptr() % 64:   # the kernel's aligned vector loads
        raise RuntimeError("a packed weight is not 64-byte aligned")
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, n: int,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) for the weight [n, K] that `packed` holds. Written for a
    decode step's calls, which cost microseconds each: no more tensor operations than needed."""
    k = x.shape[-1]
    if packed.shape[1] != (k + 1) // 2 if packed.dim() == 4 else packed.shape[1] != k:
        raise ValueError(f"linear: input of width {k} for a weight packed as "
                         f"{tuple(packed.shape)}")
    if x.dtype != packed.dtype:
        raise TypeError(f"linear: input {x.dtype}, weight {packed.dtype}")
    if not x.is_contiguous():
        x = x.contiguous()
    m = x.numel() // k
    y = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
    if m and _fn[x.dtype](x.data_ptr(), m, k, packed.data_ptr(), n, y.data_ptr()):
        raise MemoryError(f"linear: {m} x {k} float32 activations")
    return y if bias is None else y + bias


def check(lib: ctypes.CDLL) -> None:
    """Refuse a build that computes wrongly here (a compiler or CPU not seen before): results
    within float rounding of a float64 reference, and each row's bits the same at every row
    count, for odd shapes that cross the tiles and row groups."""
    gen = torch.Generator().manual_seed(0)
    for dtype in DTYPES:
        w = torch.randn(TILE * 2 + 3, 37, generator=gen).to(dtype)
        x = torch.randn(13, 37, generator=gen).to(dtype)
        packed = pack(w)
        y = linear(x, packed, w.shape[0])
        ref = F.linear(x.double(), w.double())
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        if not torch.allclose(y.double(), ref, rtol=tol, atol=tol * 10):
            raise RuntimeError(f"the built linear kernel computes wrongly in {dtype} here")
        alone = torch.cat([linear(x[i:i + 1], packed, w.shape[0]) for i in range(len(x))])
        if not all(torch.equal(linear(x[:m], packed, w.shape[0]), alone[:m])
                   for m in range(1, len(x) + 1)):
            raise RuntimeError(f"the built linear kernel's rows depend on the row count in {dtype}")


def pack_model(model) -> int:
    """Pack the model.Linear layers of `model` (a Transformer, or swift's SkipView over one)
    whose weight is float32 or bfloat16 on the CPU. A layer's unpacked weight is dropped, the
    packed copy replacing it in memory, but the LM head's, which the embedding may share (tied)
    and heads and distillation read. Returns how many layers are packed. A layer is one that can
    hold a packed weight (model.Linear's `packed`; this package imports nothing of the model)."""
    layers = model.modules() if isinstance(model, torch.nn.Module) else \
        (m for layer in model.layers for m in layer.modules())
    count = 0
    for m in layers:
        if not (isinstance(m, torch.nn.Linear) and hasattr(m, "packed")):
            continue
        if m.packed is None and m.weight.device.type == "cpu" and m.weight.dtype in DTYPES:
            m.packed = pack(m.weight)
            if m is not model.lm_head:
                m.weight = None
        count += m.packed is not None
    return count
