"""Where one decode step's time goes, by kind of work: GEMM, attention, norm, rotary, KV write,
elementwise, casts and copies, sampling; kernels a step; the bytes each step's GEMMs read over
their time.

For each model given (a target and a draft), batch size and mode (plain, and exact: the
batch-invariant arithmetic), rows of `--context` cached tokens take one-token greedy steps as a
server's do (Engine.verify without drafts). The step is timed as served (CUDA graphs on a GPU); then
profiled eagerly (torch.profiler), where every kernel or operator is put under the innermost piece
of the model that ran it: a linear layer (GEMM), attention (its KV write apart), an RMSNorm, RoPE
(the rotation and its table), the LM head's sampling and verdict; what runs in a decoder layer
outside those is elementwise work (residual adds, SiLU x up); copies and casts anywhere are their
own kind. On the CPU the CPU's own kernels (specdec/kernels/cpu) count under the piece that called
them.

    python3 benchmarks/step_profile.py --device cuda --models /tmp/rp/target,/tmp/rp/draft \\
        --batches 1,16 --context 512               # the GPU checklist's `profile` step
    .venv/bin/python benchmarks/step_profile.py --models /models/smol/target --batches 1,16

Markdown on stdout, JSON with --json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

from inputs import DEFAULT_TARGET
from machine import git_state, machine

from specdec.runtime import attention, engine as engine_module, model
from specdec.kernels.cpu import build
from specdec.runtime.engine import Engine
from specdec.runtime.kv_cache import KVCache
from specdec.records import SamplingParams, VerifyCall

KINDS = ("GEMM", "attention", "KV write", "norm", "rotary", "elementwise", "casts/copies",
         "sampling", "other")
SCOPE = "specdec::"


@contextmanager
def scopes():
    """Each piece of the model run inside a profiler range named for its kind, while inside."""
    patched = []

    def wrap(owner, name, kind):
        fn = getattr(owner, name)

        def scoped(*args, **kwargs):
            with torch.profiler.record_function(SCOPE + kind):
                return fn(*args, **kwargs)
        setattr(owner, name, scoped)
        patched.append((owner, name, fn))
    wrap(model.Linear, "forward", "GEMM")
    wrap(model.RMSNorm, "forward", "norm")
    wrap(model.RMSNorm, "add", "norm")   # with the residual add before it, fused or not
    wrap(model, "rotate", "rotary")
    wrap(model, "rotation", "rotary")
    wrap(attention, "attend", "attention")
    wrap(KVCache, "write", "KV write")
    wrap(model.DecoderLayer, "forward", "elementwise")
    wrap(engine_module, "verify_greedy", "sampling")
    wrap(engine_module, "verify_drafts", "sampling")
    wrap(engine_module, "probabilities", "sampling")
    try:
        yield
    finally:
        for owner, name, fn in reversed(patched):
            setattr(owner, name, fn)


def kind_of(event, kernel_name: str = "") -> str:
    """The innermost scope above a profiler event; copies and casts are theirs anywhere."""
    name = (kernel_name or event.name).lower()
    if any(w in name for w in ("copy", "_to_copy", "cast", "convert")) and \
            "gemm" not in name:
        return "casts/copies"
    e = event
    while e is not None:
        if e.name.startswith(SCOPE):
            return e.name[len(SCOPE):]
        e = e.cpu_parent
    return "other"


def stepper(engine: Engine, batch: int, context: int):
    """A one-token greedy step of `batch` rows, each after a prefill of `context` tokens and
    3 steps of warm-up."""
    greedy = SamplingParams()
    engine.verify([VerifyCall(i, 0, list(range(1, context + 1)), [], None, greedy)
                   for i in range(batch)])
    lengths, tokens = [context] * batch, [[7]] * batch

    def step():
        out = engine.verify([VerifyCall(i, lengths[i], tokens[i], [], None, greedy)
                             for i in range(batch)])
        for i, v in enumerate(out):
            lengths[i] += len(tokens[i])
            tokens[i] = v.tokens
    for _ in range(3):
        step()
    sync(engine.device)
    return step


def timed(engine: Engine, batch: int, context: int, n: int) -> float:
    """Seconds a step takes, as served (CUDA graphs where the engine has them)."""
    step = stepper(engine, batch, context)
    t0 = time.perf_counter()
    for _ in range(n):
        step()
    sync(engine.device)
    seconds = (time.perf_counter() - t0) / n
    engine.release(list(range(batch)))
    return seconds


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def profile(engine: Engine, batch: int, context: int, n: int) -> dict:
    """Time by kind (ms a step) and kernels a step (on the CPU: operator calls), eager: no
    CUDA graphs, so that each kernel is seen with the operator that launched it."""
    graphs, engine.graphs = engine.graphs, None
    cuda = engine.device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    try:
        with scopes():
            step = stepper(engine, batch, context)
            with torch.profiler.profile(activities=activities) as prof:
                for _ in range(n):
                    step()
                sync(engine.device)
            engine.release(list(range(batch)))
    finally:
        engine.graphs = graphs
    by_kind, kernels = defaultdict(float), 0
    for e in prof.events():
        if cuda:
            for k in e.kernels:
                by_kind[kind_of(e, k.name)] += k.duration
                kernels += 1
        else:   # self times: a scope's own is the CPU kernel it called (specdec/kernels/cpu)
            by_kind[kind_of(e)] += e.self_cpu_time_total
            kernels += not e.name.startswith(SCOPE) and not e.cpu_children
    return {"ms": {k: by_kind[k] / n / 1000 for k in KINDS if by_kind[k]},
            "kernels": kernels / n}


def weight_bytes(engine: Engine) -> int:
    """What a step's GEMMs read: every linear layer's weight, the LM head's included."""
    total = 0
    for m in engine.model.modules():
        if isinstance(m, model.Linear):
            w = m.packed if m.packed is not None else m.weight
            total += w.numel() * w.element_size()
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--models", default=str(DEFAULT_TARGET),
                    help="checkpoint directories, comma-separated (target, draft)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--dtype", help="default: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--modes", default="plain,exact",
                    help="plain, exact, and each with -fused: the layers' norms and SiLU x up by "
                         "gpu_pointwise's Triton kernels (SPECDEC_FUSED_POINTWISE, CUDA only)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--kernel-threads", type=int, default=0,
                    help="the CPU kernels' threads (0: every core, as served)")
    ap.add_argument("--cpu-kernels", choices=("auto", "off"), default="auto",
                    help="off: the CPU engine on PyTorch's operators (SPECDEC_CPU_KERNELS=off)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else engine_module.default_dtype(dev)
    if dev.type == "cpu":
        torch.set_num_threads(1)
        import os
        build.set_threads(args.kernel_threads or len(os.sched_getaffinity(0)))
    batches = [int(b) for b in args.batches.split(",")]
    rows = []
    for path in args.models.split(","):
        for mode in args.modes.split(","):
            base, _, fused = mode.partition("-")
            engine = Engine.load(path, max(batches), args.context + args.steps + 16, dtype, dev,
                                 batch_invariant=base == "exact",
                                 cpu_kernel=None if args.cpu_kernels == "auto" else False,
                                 fused_pointwise=fused == "fused")
            if fused and not engine.fused_pointwise:
                print(f"{mode}: the fused kernels are not attached here (CUDA only, or their "
                      f"probe failed): the same as {base}", file=sys.stderr)
            if engine.graphs is not None:
                engine.capture_graphs()
            read = weight_bytes(engine)
            for b in batches:
                step_s = timed(engine, b, args.context, args.steps)
                prof = profile(engine, b, args.context, args.steps)
                gemm = prof["ms"].get("GEMM", 0.0)
                rows.append({"model": Path(path).name or path, "mode": mode, "batch": b,
                             "step_ms": 1000 * step_s, "kernels": prof["kernels"],
                             "eager_ms": prof["ms"], "weight_bytes": read,
                             "gemm_gb_s": read / gemm / 1e6 if gemm else None})
                print(f"{path} {mode} batch {b}: {1000 * step_s:.2f} ms", file=sys.stderr)
            del engine
    kernels = "" if dev.type == "cuda" else (
        ", the CPU's kernels" if args.cpu_kernels == "auto" else ", PyTorch's operators")
    print(f"## One decode step by kind ({args.device}, {str(dtype).removeprefix('torch.')}, "
          f"{args.context} cached tokens{kernels})\n")
    print("ms a step, eager (the kinds' sum is the eager step, which CUDA graphs shorten); "
          "GEMM GB/s: the weights read over the GEMMs' time.\n")
    print("| model | mode | batch | step ms | kernels | " + " | ".join(KINDS) + " | GEMM GB/s |")
    print("|---|---|---:|---:|---:|" + "---:|" * len(KINDS) + "---:|")
    for r in rows:
        cells = [f"{r['eager_ms'].get(k, 0):.2f}" for k in KINDS]
        gbs = f"{r['gemm_gb_s']:.0f}" if r["gemm_gb_s"] else "-"
        print(f"| {r['model']} | {r['mode']} | {r['batch']} | {r['step_ms']:.2f} | "
              f"{r['kernels']:.0f} | " + " | ".join(cells) + f" | {gbs} |")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "git": git_state(),
                                         "device": args.device, "dtype": str(dtype),
                                         "context": args.context, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
