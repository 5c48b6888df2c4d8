"""Attention over the KV slot pool on the CPU by attention.c: the forward's keys and values
written into the pool, then each query over its own slot's keys in place.

No mask, no gathered or padded keys: where SDPA over the pool took 0.69 ms a layer for 16 rows
of one token each (smollm2-135m's shapes, 150 cached tokens) this takes about 0.2 ms, and a query's
result is bitwise its own whatever the forward holds (attention.c), which the exact mode needs.
"""
from __future__ import annotations

import ctypes

import torch

DTYPES = (torch.float32, torch.bfloat16)
MAX_WIDTH = 8192     # attention.c's bound on heads x head_dim
_fn: dict[torch.dtype, ctypes._CFuncPtr] = {}


def declare(lib: ctypes.CDLL) -> None:
    p, n = ctypes.c_void_p, ctypes.c_long
    f = ctypes.c_float
    for name, dtype in (("attend_f32", torch.float32), ("attend_bf16", torch.bfloat16)):
        fn = getattr(lib, name)
        fn.argtypes = [p, n, p, n, p, n, p, p, n, p, p, p, n, n, n, n, n, f, f, p, p, n, p]
        fn.restype = ctypes.c_int
        _fn[dtype] = fn


def usable(heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> bool:
    return (dtype in DTYPES and head_dim % 16 == 0 and head_dim <= 512
            and heads * head_dim <= MAX_WIDTH and heads % kv_heads == 0)


def _tokens(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x [B, T, heads, D] as tokens of heads x D contiguous elements: (x, a token's stride)."""
    b, t, h, d = x.shape
    if x.stride(3) != 1 or x.stride(2) != d or (b > 1 and x.stride(0) != t * x.stride(1)):
        x = x.contiguous()
    return x, x.stride(1) if t > 1 else x.stride(0)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_k: torch.Tensor,
           cache_v: torch.Tensor, write_slots: torch.Tensor, positions: torch.Tensor,
           read_slots: torch.Tensor, window: int, scale: float, softcap: float | None,
           rotary: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """q [B, T, H, D]; k, v [B, T, KV, D]; cache_k, cache_v [slots, max_len, KV, D];
    write_slots, positions, read_slots: [B T] int64 per token, contiguous. rotary: RoPE's
    (cos, sin) [B, T, 1, R] (model.rotation) to rotate q and k with, or None where they come
    rotated. Writes k and v at (write_slots, positions), then returns each query's attention
    [B, T, H, D] over the keys of its read slot at its window's positions up to its own."""
    b, t, h, d = q.shape
    if not (write_slots.is_contiguous() and positions.is_contiguous()
            and read_slots.is_contiguous()) or len(read_slots) != b * t:
        raise ValueError("attention: slots and positions are one contiguous int64 per token")
    q, sq = _tokens(q)
    k, sk = _tokens(k)
    v, sv = _tokens(v)
    cos = sin = None
    if rotary is not None:
        cos, sin = (x.reshape(b * t, -1).contiguous() for x in rotary)       # [B T, R]
    out = torch.empty(b, t, h, d, dtype=q.dtype)
    err = _fn[q.dtype](q.data_ptr(), sq, k.data_ptr(), sk, v.data_ptr(), sv, cache_k.data_ptr(),
                       cache_v.data_ptr(), cache_k.shape[1], write_slots.data_ptr(),
                       positions.data_ptr(), read_slots.data_ptr(), b * t, h, k.shape[2], d,
                       window, scale, softcap or 0.0, None if cos is None else cos.data_ptr(),
                       None if sin is None else sin.data_ptr(),
                       0 if cos is None else cos.shape[1], out.data_ptr())
    if err:
        raise MemoryError("attention: no memory for the scores") if err == -1 else \
            ValueError(f"attention: {h} heads over {k.shape[2]} of size {d} are past its bounds")
    return out


def check(lib: ctypes.CDLL) -> None:
    """Refuse a build that computes wrongly here: each query's output within float rounding of a
    float64 softmax over its keys (global and windowed, capped), the writes where they belong,
    and a query's bits the same alone as among others."""
    gen = torch.Generator().manual_seed(0)
    slots, max_len, kv, h, d = 3, 40, 2, 4, 32
    for dtype in DTYPES:
        ck = torch.randn(slots, max_len, kv, d, generator=gen).to(dtype)
        cv = torch.randn(slots, max_len, kv, d, generator=gen).to(dtype)
        q = torch.randn(1, 5, h, d, generator=gen).to(dtype)
        k = torch.randn(1, 5, kv, d, generator=gen).to(dtype)
        v = torch.randn(1, 5, kv, d, generator=gen).to(dtype)
        pos = torch.tensor([0, 1, 17, 18, 39])
        slot = torch.tensor([0, 0, 1, 1, 2])
        for window, cap in ((0, None), (7, 20.0)):
            ck2, cv2 = ck.clone(), cv.clone()
            out = attend(q, k, v, ck2, cv2, slot, pos, slot, window, d ** -0.5, cap)
            if not (torch.equal(ck2[slot, pos], k[0]) and torch.equal(cv2[slot, pos], v[0])):
                raise RuntimeError(f"the built attention kernel writes wrongly in {dtype} here")
            ref = reference(q[0], ck2, cv2, slot, pos, window, d ** -0.5, cap)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            if not torch.allclose(out[0].double(), ref, rtol=tol, atol=tol):
                raise RuntimeError(f"the built attention kernel computes wrongly in {dtype} here")
            for i in range(5):
                one = attend(q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], ck2.clone(), cv2.clone(),
                             slot[i:i + 1], pos[i:i + 1], slot[i:i + 1], window, d ** -0.5, cap)
                if not torch.equal(one[0, 0], out[0, i]):
                    raise RuntimeError(f"the built attention kernel's queries depend on their "
                                       f"call in {dtype}")
        # RoPE in the kernel: as rotating q and k first (a partial rotation, 24 of 32 dims).
        angle = torch.randn(1, 5, 1, 12, generator=gen)
        cos = torch.cat((angle, angle), -1).cos()
        half = angle.sin()
        sin = torch.cat((-half, half), -1)
        rotated = [torch.cat((x[..., :24].float() * cos + x[..., :24].float().roll(12, -1) * sin,
                              x[..., 24:].float()), -1).to(dtype) for x in (q, k)]
        ck2, cv2 = ck.clone(), cv.clone()
        first = attend(*rotated, v, ck2, cv2, slot, pos, slot, 0, d ** -0.5, None)
        ck3, cv3 = ck.clone(), cv.clone()
        fused = attend(q, k, v, ck3, cv3, slot, pos, slot, 0, d ** -0.5, None,
                       (cos.to(dtype), sin.to(dtype)))
        tol = 1e-5 if dtype == torch.float32 else 3e-2
        if not (torch.allclose(fused.float(), first.float(), rtol=tol, atol=tol)
                and torch.allclose(ck3.float(), ck2.float(), rtol=tol, atol=tol)):
            raise RuntimeError(f"the built attention kernel rotates wrongly in {dtype} here")


def reference(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, slots: torch.Tensor,
              positions: torch.Tensor, window: int, scale: float,
              softcap: float | None) -> torch.Tensor:
    """What `attend` returns for queries q [N, H, D], in float64, one query at a time."""
    n, h, d = q.shape
    kv = cache_k.shape[2]
    outs = []
    for i in range(n):
        p = int(positions[i])
        lo = max(0, p - window + 1) if window else 0
        keys = cache_k[slots[i], lo:p + 1].double()                        # [L, KV, D]
        values = cache_v[slots[i], lo:p + 1].double()
        s = torch.einsum("cgd,lcd->cgl", q[i].double().view(kv, h // kv, d), keys) * scale
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        outs.append(torch.einsum("cgl,lcd->cgd", s.softmax(-1), values).reshape(h, d))
    return torch.stack(outs)
