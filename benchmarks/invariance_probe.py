"""Which operators give a token's row the same bits whatever else its forward holds, on this
device and dtype, and what the batch-invariant linear layer costs (specdec/kernels/invariant.py).

Per operator and shape (the default target's and Llama-3.1-8B's, random weights made here), the
row counts M in 1..--max-rows at which some row differs from the same row computed alone:
F.linear, invariant.linear, the CPU's blocked bmm on this device, RMSNorm; and for
invariant.attention (and the CPU's path, and a variant without padding, here on this device),
the (end, tokens in the call, rows, masked keys past the end) at which a query's output
differs from the same query alone. On CUDA also invariant_gemm's Triton kernel, in 16-row
tiles and as served with its wide tiles from 64 rows. Then the median ms of each linear at 8B's
shapes (M 1 to 2048: steps, verifications, prefills), of the attentions at 16 rows x 9 tokens,
and of invariant_attention's kernel against the padded calls at 16 rows and at one.

    python3 benchmarks/invariance_probe.py --device cuda --json $OUT/invariance.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.kernels import invariant, invariant_attention, invariant_gemm
from specdec.runtime.config import ModelArgs
from specdec.runtime.model import RMSNorm

ROOT = Path(__file__).resolve().parents[1]

# (in, out) of Llama-3.1-8B's linear layers: q/o, k/v, gate/up, down, lm_head.
SHAPES_8B = [(4096, 4096), (4096, 1024), (4096, 14336), (14336, 4096), (4096, 128256)]


def bmm_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The CPU's invariant.linear (16-row blocks in one bmm over a stride-0 weight), here."""
    m = x.shape[0]
    rows = F.pad(x, (0, 0, 0, -m % invariant.ROWS)).view(-1, invariant.ROWS, x.shape[1])
    return torch.bmm(rows, w.t().expand(rows.shape[0], -1, -1)).reshape(-1, w.shape[0])[:m]


LINEARS = {"F.linear": lambda x, w: F.linear(x, w),
           "invariant.linear": lambda x, w: invariant.linear(x, w, None),
           "16-row bmm": bmm_linear}
# CUDA: invariant.linear above is its cuBLAS blocks (these weights are not probed), and the
# Triton kernel that serves where its load probe passes (specdec/kernels/invariant_gemm.py).
# The kernel's 16-row tiles for every M, and as served where the probe passes its wide tiles:
# 64 x 64 from WIDE_FROM rows (its rows against each row alone in 16-row tiles: do the two
# tensor-core instructions round alike?).
CUDA_LINEARS = {"triton GEMM": lambda x, w: invariant_gemm.linear(x, w, False),
                "triton GEMM wide from 64": lambda x, w: invariant_gemm.linear(
                    x, w, x.shape[0] >= invariant_gemm.WIDE_FROM)}


def differing_rows(fn, x: torch.Tensor, max_rows: int) -> list[int]:
    """The M at which fn(x[:M]) differs, in any row, from each row computed alone."""
    alone = torch.cat([fn(x[i:i + 1]) for i in range(max_rows)])
    return [m for m in range(2, max_rows + 1) if not torch.equal(fn(x[:m]), alone[:m])]


def stacked_attention(q, k, v, mask, scale):
    """A candidate that failed on an H200: invariant.attention's CUDA call unpadded (rows and
    tokens as they come), per row and key/value head one score GEMM."""
    return invariant._attention_call(q, k, v, mask, scale, None, q.shape[0], q.shape[2])


ATTENTIONS = {"invariant.attention": lambda q, k, v, m, s: invariant.attention(q, k, v, m, s, None),
              "CPU path (per-token GEMMs)":
                  lambda q, k, v, m, s: invariant._attention_blocks(q, k, v, m, s, None),
              "unpadded stacked GEMMs": stacked_attention}


def attention_differs(fn, device, dtype, kv: int, g: int, d: int, gen) -> list[list[int]]:
    """(end, t, b, extra) at which the last query of t tokens, in a call of b rows over `extra`
    masked keys past the end, differs from it alone, at ends around 64-key blocks."""
    bad = []
    for end in (40, 63, 64, 65, 127, 130, 200):
        n = end + 128
        k = torch.randn(16, kv, n, d, generator=gen).to(device, dtype)
        v = torch.randn(16, kv, n, d, generator=gen).to(device, dtype)
        q = torch.randn(16, kv * g, 9, d, generator=gen).to(device, dtype)
        pos = torch.arange(n, device=device)
        with torch.inference_mode():
            def call(t, b, extra):
                qs = q[:b, :, 9 - t:]
                mask = (pos[None, :end + extra] <=
                        torch.arange(end - t, end, device=device)[:, None])
                return fn(qs, k[:b, :, :end + extra], v[:b, :, :end + extra],
                          mask[None, None].expand(b, 1, t, end + extra), d ** -0.5)[:, :, -1]
            alone = call(1, 1, 0)[0]
            for t in (1, 2, 3, 5, 9):
                for b in (1, 3, 16):
                    for extra in (0, 64, 128):
                        if not torch.equal(call(t, b, extra)[0], alone):
                            bad.append([end, t, b, extra])
    return bad


def kernel_attention_ms(model: str, kv: int, g: int, d: int, dtype, device) -> list[dict]:
    """invariant_attention's kernel, as a call chooses and in both forms (a program per query
    tile; per tile and 256-key split, merged after), against invariant.attention's padded
    calls: 16 rows x 9 tokens and 1 row x 1 token at position 575, over a cache of 576 keys and
    of 4096 (CUDA graphs attend over the cache's max_len; the kernel reads up to each row's
    position), and at a long context's position 4095 one row and four."""
    rows = []
    for b, t, length, last in ((16, 9, 576, 575), (16, 9, 4096, 575), (1, 1, 576, 575),
                               (1, 1, 4096, 575), (1, 1, 4096, 4095), (4, 9, 4096, 4095)):
        k = torch.randn(b, length, kv, d, device=device, dtype=dtype)
        v = torch.randn_like(k)
        q = torch.randn(b, t, kv * g, d, device=device, dtype=dtype)
        slots = torch.arange(b, device=device)
        positions = torch.arange(last + 1 - t, last + 1, device=device).expand(b, t)
        mask = (torch.arange(length, device=device) <= positions[:, None, :, None])

        def kernel(split):
            return lambda: invariant_attention.attend(q, k, v, slots, positions, 0, d ** -0.5,
                                                      None, split)
        ms = {"triton attention": timed(kernel(None), device),
              "per tile": timed(kernel(False), device),
              "split": timed(kernel(True), device),
              "invariant.attention": timed(lambda: invariant.attention(
                  q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask,
                  d ** -0.5, None), device)}
        rows.append(dict(attention=model, rows=b, tokens=t, keys=length, position=last, **ms))
        print(f"attention {model}, {b} rows x {t} tokens at position {last}, cache of {length}: "
              + ", ".join(f"{k_} {v_:.3f} ms" for k_, v_ in ms.items()), flush=True)
    return rows


def timed(fn, device, n: int = 30) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(n):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--max-rows", type=int, default=160)
    ap.add_argument("--target", type=Path, default=ROOT / "models" / "default" / "target")
    ap.add_argument("--skip-8b", action="store_true", help="the default target's shapes only")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    device, dtype = torch.device(a.device), getattr(torch, a.dtype)
    gen = torch.Generator().manual_seed(0)
    args = ModelArgs.from_dir(a.target)
    h, inter = args.hidden_size, args.intermediate_size
    kv, g, d = args.num_kv_heads, args.num_heads // args.num_kv_heads, args.head_dim
    shapes = [("default", (h, args.num_heads * d)), ("default", (h, kv * d)),
              ("default", (h, inter)), ("default", (inter, h)), ("default", (h, args.vocab_size))]
    shapes += [] if a.skip_8b else [("8b", s) for s in SHAPES_8B]
    out: dict = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                 "dtype": a.dtype, "linear": [], "rmsnorm": [], "attention": {}, "ms": []}
    linears = LINEARS | (CUDA_LINEARS if device.type == "cuda" else {})
    with torch.inference_mode():
        for model, (n_in, n_out) in shapes:
            w = (torch.randn(n_out, n_in, generator=gen) * n_in ** -0.5).to(device, dtype)
            x = torch.randn(a.max_rows, n_in, generator=gen).to(device, dtype)
            for name, fn in linears.items():
                bad = differing_rows(lambda r: fn(r, w), x, a.max_rows)
                out["linear"].append(dict(model=model, shape=[n_in, n_out], op=name, differ_at=bad))
                print(f"{model} [{n_in} -> {n_out}] {name}: "
                      f"{len(bad)} of {a.max_rows - 1} row counts differ"
                      + (f" (first {bad[:8]})" if bad else ""), flush=True)
            if model == "8b" and device.type == "cuda":
                # 5, 80: a K=4 verification of 1 and 16 rows; 512, 2048: prompts' prefills
                x = torch.randn(2048, n_in, generator=gen).to(device, dtype)
                for m in (1, 5, 16, 48, 80, 144, 512, 2048):
                    row = dict(shape=[n_in, n_out], m=m)
                    for name, fn in linears.items():
                        row[name] = timed(lambda: fn(x[:m], w), device)
                    out["ms"].append(row)
                    print(f"8b [{n_in} -> {n_out}] M={m}: " + ", ".join(
                        f"{k} {v:.3f} ms" for k, v in row.items() if k not in ("shape", "m")),
                        flush=True)
        for dim in (h, 4096):
            norm = RMSNorm(dim, 1e-5).to(device, dtype)
            x = torch.randn(a.max_rows, dim, generator=gen).to(device, dtype)
            bad = differing_rows(norm, x, a.max_rows)
            out["rmsnorm"].append(dict(dim=dim, differ_at=bad))
            print(f"RMSNorm {dim}: {len(bad)} of {a.max_rows - 1} row counts differ"
                  + (f" (first {bad[:8]})" if bad else ""), flush=True)
        for model, (kv_, g_, d_) in [("default", (kv, g, d))] + \
                ([] if a.skip_8b else [("8b", (8, 4, 128))]):
            for name, fn in ATTENTIONS.items():
                bad = attention_differs(fn, device, dtype, kv_, g_, d_, gen)
                out["attention"][f"{model} {name}"] = bad
                print(f"{name} {model}: {len(bad)} (end, t, b, extra) of 315 differ"
                      + (f" (first {bad[:6]})" if bad else ""), flush=True)
            if device.type == "cuda":   # a verification's attention at 8B's shape, 16 x 9
                q = torch.randn(16, kv_ * g_, 9, d_, device=device, dtype=dtype)
                k = torch.randn(16, kv_, 576, d_, device=device, dtype=dtype)
                v = torch.randn_like(k)
                m = torch.ones(16, 1, 9, 576, dtype=torch.bool, device=device)
                ms = {name: timed(lambda fn=fn: fn(q, k, v, m, d_ ** -0.5), device)
                      for name, fn in ATTENTIONS.items()}
                out["ms"].append(dict(attention=model, **ms))
                print(f"attention {model}, 16 rows x 9 tokens over 576 keys: " +
                      ", ".join(f"{k_} {v_:.3f} ms" for k_, v_ in ms.items()), flush=True)
                out["ms"] += kernel_attention_ms(model, kv_, g_, d_, dtype, device)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
