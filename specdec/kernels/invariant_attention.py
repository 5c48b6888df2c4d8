"""Batch-invariant attention for CUDA in 16-bit dtypes: one Triton kernel over the KV slot pool.

invariant.attention on CUDA otherwise keeps cuBLAS on one shape by padding: every call is
exactly ATTN_ROWS rows x ATTN_TOKENS tokens, over all the batch's keys in float32 copies. Under
CUDA graphs the batch's keys are the cache's max_len, so a decode step at one row read 16 rows
of max_len keys per layer, whatever the sequence's length. This kernel reads each row's keys in
place from its slot, up to its own last query's position, in one fixed chain
(triton_kernels.py): SPLIT-key splits from key 0, each an online softmax over BLOCK_N-key
blocks, merged in order. A query's sums run over the same blocks and splits in the same order
alone or beside other rows and tokens, and those past its position are exact no-ops. Small
calls run a program per split and merge after, so a one-row decode step keeps the GPU busy;
large ones a program per query tile; the same bits either way.

`probe` checks that at load on the device itself, per (KV heads, group, head dim, dtype,
softcap): a query alone equal, bit for bit, to the same query among four tokens of its row with
rows of other lengths beside it, in both forms, and every output close to plain softmax
attention. Where it fails (or triton is missing or does not compile), the log says so and
attention keeps invariant.attention's padded calls.
"""
from __future__ import annotations

import functools
import logging

import torch

log = logging.getLogger("specdec")

# The tiling: BLOCK_N and SPLIT are part of the arithmetic (the online softmax's rescales fall at
# block edges, its merges at split edges), so fixed; BLOCK_M queries (tokens x group) a program.
# Chosen, not tuned on a GPU yet.
BLOCK_M, BLOCK_N, SPLIT = 16, 64, 256
NUM_WARPS, NUM_STAGES = 4, 2
# The split form's states, for every split of the cache's length (under CUDA graphs which ones a
# row reaches is not known on the host), at most this many bytes a call: a graph keeps what its
# capture allocated. Past it the call runs a program per tile (the same bits).
PART_BYTES = 64 << 20

_ready: dict[tuple, bool] = {}
_kernel = None
enabled = True   # False: the padded calls (benchmarks time both)


def _build():
    from .triton_kernels import attention, attention_merge
    return attention, attention_merge


@functools.cache
def _processors(device: torch.device) -> int:
    """Streaming multiprocessors: a call with fewer programs than this splits its keys."""
    if device.type != "cuda":
        return 132   # Triton's interpreter on the CPU: an H100's count
    return torch.cuda.get_device_properties(device).multi_processor_count


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
           positions: torch.Tensor, window: int, scale: float, softcap: float | None,
           split: bool | None = None) -> torch.Tensor:
    """q [B, T, H, D]; k_cache, v_cache [S, L, KV, D] holding this forward's keys and values;
    slots [B] each row's slot; positions [B, T]. Returns [B, T, H, D]: query (b, t) over keys
    0..positions[b, t] of slot slots[b] (the last `window` of them where window > 0).
    split: a program per SPLIT keys, merged after (None: where a program per query tile would
    leave processors idle); the output is the same either way, bit for bit."""
    global _kernel
    if _kernel is None:
        _kernel = _build()
    kernel, merge = _kernel
    b, t, h, d = q.shape
    length, kv = k_cache.shape[1], k_cache.shape[2]
    g = h // kv
    out = torch.empty(b, t, h, d, dtype=q.dtype, device=q.device)
    if b == 0 or t == 0:
        return out
    tiles, splits, rows = -(-(t * g) // BLOCK_M), -(-length // SPLIT), t * g
    if split is None:
        split = (splits > 1 and b * kv * tiles < _processors(q.device)
                 and b * kv * splits * rows * (d + 2) * 4 <= PART_BYTES)
    bd = max(16, 1 << (d - 1).bit_length())
    if split:   # each (row, KV head)'s split states: [splits, T x G] (acc: x d)
        part_m = torch.empty(b * kv * splits * rows, dtype=torch.float32, device=q.device)
        part_l, part_acc = torch.empty_like(part_m), part_m.new_empty(part_m.numel() * d)
    else:
        part_m = part_l = part_acc = out   # not read
    args = (positions, t, g, length, window)
    strides = (*out.stride(), *positions.stride(), splits * rows, rows)
    kernel[(tiles * splits if split else tiles, kv, b)](
        q, k_cache, v_cache, out, part_m, part_l, part_acc, slots, *args, scale,
        softcap or 0.0, *q.stride(), *k_cache.stride(), *v_cache.stride(), *strides,
        D=d, BM=BLOCK_M, BN=BLOCK_N, BD=bd, SPLIT=SPLIT, CAP=softcap is not None,
        DIRECT=not split, num_warps=NUM_WARPS, num_stages=NUM_STAGES)
    if split:
        merge[(tiles, kv, b)](part_m, part_l, part_acc, out, *args, *strides, BM=BLOCK_M,
                              BN=BLOCK_N, BD=bd, D=d, SPLIT=SPLIT, num_warps=NUM_WARPS)
    return out


def _key(device, dtype, kv: int, g: int, d: int, softcap: float | None) -> tuple:
    return (str(device), dtype, kv, g, d, softcap)


def ready(q: torch.Tensor, k_cache: torch.Tensor, softcap: float | None) -> bool:
    """Whether `probe` found the kernel usable for this attention's shape and dtype. Asked on
    every invariant attention call: where nothing was probed (the CPU) no key is built."""
    if not (enabled and _ready):
        return False
    kv = k_cache.shape[2]
    return _ready.get(_key(q.device, q.dtype, kv, q.shape[2] // kv, q.shape[3], softcap), False)


def probed() -> dict[str, bool]:
    """What `probe` found, by shape: for benchmarks' records."""
    return {f"attention {kv} KV x {g}, head dim {d}, {str(dtype).removeprefix('torch.')} "
            f"{device}" + (f", softcap {cap}" if cap else ""): ok
            for (device, dtype, kv, g, d, cap), ok in _ready.items()}


def reference(q, k_cache, v_cache, slots, positions, window, scale, softcap) -> torch.Tensor:
    """Plain softmax attention in float32, query by query: what `attend` must come close to."""
    b, t, h, d = q.shape
    g = h // k_cache.shape[2]
    out = torch.zeros(b, t, h, d, dtype=torch.float32, device=q.device)
    for r in range(b):
        for i in range(t):
            p = int(positions[r, i])
            lo = max(0, p - window + 1) if window else 0
            keys = k_cache[slots[r], lo:p + 1].float().repeat_interleave(g, 1)   # [n, H, D]
            values = v_cache[slots[r], lo:p + 1].float().repeat_interleave(g, 1)
            s = torch.einsum("hd,nhd->hn", q[r, i].float(), keys) * scale
            if softcap is not None:
                s = torch.tanh(s / softcap) * softcap
            out[r, i] = torch.einsum("hn,nhd->hd", s.softmax(-1), values)
    return out


def probe(kv: int, g: int, d: int, dtype: torch.dtype, device: torch.device,
          softcap: float | None = None) -> bool:
    """At load, before any CUDA graph is captured: whether the kernel attends row-invariantly
    and close to plain attention at this shape on this device (cached; logs why not, once)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:   # `ready` asks with a tensor's cuda:N
        device = torch.device("cuda", torch.cuda.current_device())
    key = _key(device, dtype, kv, g, d, softcap)
    if key in _ready:
        return _ready[key]
    try:
        why = _check(kv, g, d, dtype, device, softcap)
    except Exception as exc:   # no triton, no compiler for this device, ...
        why = f"{type(exc).__name__}: {exc}"
    _ready[key] = why is None
    if why is not None:
        log.warning("specdec: invariant attention for %d KV heads x %d, head dim %d, %s on %s: "
                    "%s; attention uses padded float32 calls", kv, g, d,
                    str(dtype).removeprefix("torch."), device, why)
    return _ready[key]


def _check(kv: int, g: int, d: int, dtype, device, softcap) -> str | None:
    gen = torch.Generator().manual_seed(0)
    slots_n, length = 4, 3 * SPLIT
    k_cache = torch.randn(slots_n, length, kv, d, generator=gen).to(device, dtype)
    v_cache = torch.randn(slots_n, length, kv, d, generator=gen).to(device, dtype)
    scale = d ** -0.5
    # row 0 (slot 2) queries positions across the first split's end; beside it a short row and
    # one in the third split
    first = SPLIT - 2
    q = torch.randn(3, 4, kv * g, d, generator=gen).to(device, dtype)
    slots = torch.tensor([2, 0, 3], device=device)
    positions = torch.tensor([[first + i for i in range(4)], [3, 4, 5, 6],
                              [length - 4 + i for i in range(4)]], device=device)
    with torch.inference_mode():
        together = attend(q, k_cache, v_cache, slots, positions, 0, scale, softcap, split=False)
        if not torch.equal(together, attend(q, k_cache, v_cache, slots, positions, 0, scale,
                                            softcap, split=True)):
            return "split keys give other bits than a program per query tile"
        for i in range(4):
            alone = attend(q[:1, i:i + 1], k_cache, v_cache, slots[:1], positions[:1, i:i + 1],
                           0, scale, softcap, split=True)
            if not torch.equal(alone[0, 0], together[0, i]):
                return f"the query at position {first + i} differs from itself alone"
        ref = reference(q, k_cache, v_cache, slots, positions, 0, scale, softcap)
        err = (together.float() - ref).abs().max().item()
    if not err <= 2 ** -5:   # values ~ N(0, 1), averaged: bf16 rounds at 2^-8 of them
        return f"max error {err:.3g} against plain attention"
    return None
