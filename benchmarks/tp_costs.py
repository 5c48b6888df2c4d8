"""What tensor parallelism costs a target: at each degree, the one-token step, the
verification of K drafts (K + 1 tokens in one forward) and the share of each spent in the
collectives (an all_reduce after attention and after the MLP of every layer, one after the
embedding, an all_gather of the logits). Random weights at a preset's shape (make_random_pair.py,
llama-70b by default), built on each rank's device: no checkpoint is written or read.

    python3 benchmarks/tp_costs.py --degrees 1,2,4 --layers 20 --json $OUT/tp.json   # GPUs
    .venv/bin/python benchmarks/tp_costs.py --degrees 1,2 --scale 0.0625 --vocab-size 8192 \
        --layers 2 --batches 1 --ks 1,4 --calls 3 --warmup 1        # a dry run on the CPU (gloo)

One process per rank (torch.multiprocessing, NCCL on CUDA, gloo on the CPU), every rank running
the same calls, as target_model's ranks do, CUDA graphs off (they are off above degree 1). Every
timed call is greedy on rows of `--context` cached tokens rolled back before each call (costs.py's
Rows and Timer). The collectives' share is 1 - (the same call with every collective replaced by
a local no-op) / (the call); one all_reduce of a step's activations is also timed alone.
`--layers` overrides the preset's depth with each layer's shape kept: a 70B's 80 layers are
about 141 GB in bf16, more than one GPU, so degree 1 runs at fewer layers (20: about 38 GB) and
the per-layer figures compare across degrees; a degree whose weights and KV do not fit a GPU's
free memory is reported as skipped, not run.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from costs import Rows, Timer, _ints
from machine import git_state, machine
from make_random_pair import PRESETS, scaled

from specdec.runtime.tensor_parallel import parallel
from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.runtime.kv_cache import KVCache
from specdec.runtime.model import Transformer, rope_table


def model_args(args) -> ModelArgs:
    cfg = scaled(PRESETS[args.preset], args.scale, args.vocab_size)
    if args.layers:
        cfg["num_hidden_layers"] = args.layers
    return ModelArgs.from_dict(cfg, f"preset {args.preset}")


def meta_model(full: ModelArgs, dtype: torch.dtype, rank: int, world: int,
               tp: parallel.Shard | None) -> Transformer:
    """Rank `rank`'s Transformer on the meta device (no memory): its heads, columns and rows."""
    local = full if world == 1 else parallel.local_args(full, parallel.layout(full, rank, world))
    with torch.device("meta"):
        model = Transformer(local, tp if world > 1 else None)
    model.tie_weights()
    return model.to(dtype)


def rank_bytes(full: ModelArgs, dtype: torch.dtype, world: int, rows: int, max_len: int) -> int:
    """The weights and KV pool rank 0 holds (the largest rank: the vocabulary is padded)."""
    model = meta_model(full, dtype, 0, world, parallel.Shard(0, world))
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    a = model.args
    return weights + KVCache.bytes_needed(a.num_layers, rows, max_len, a.num_kv_heads,
                                          a.head_dim, dtype)


def random_model(full: ModelArgs, dtype: torch.dtype, device: torch.device, rank: int,
                 world: int, tp: parallel.Shard | None, seed: int) -> Transformer:
    """Random weights in place on the device (normal(0, 0.02), norms one), one copy."""
    model = meta_model(full, dtype, rank, world, tp).to_empty(device=device)
    gen = torch.Generator(device).manual_seed(seed + rank)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    model.inv_freq = rope_table(full).to(device)
    return model.eval().requires_grad_(False)


def _rank(rank: int, world: int, port: int, opts: dict, out: str) -> None:
    args = argparse.Namespace(**opts)
    cuda = args.device == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    tp = parallel.init(rank, world, "127.0.0.1", port, device, 300.0) if world > 1 else None
    try:
        full = model_args(args)
        model = random_model(full, dtype, device, rank, world, tp, args.seed)
        k_max = max(args.ks)
        engine = Engine(model, max(args.batches), args.context + k_max + 2, device,
                        cuda_graphs=False)
        timer = Timer(device, args.warmup, args.calls)
        results = {}
        for b in args.batches:
            rows = Rows(engine, 1, b, args.context, k_max, full.vocab_size, args.seed + b, False)
            results[b] = measure(engine, rows, tp, timer, args.ks, full, dtype, device, b)
            engine.release(rows.ids)
        if rank == 0:
            Path(out).write_text(json.dumps(results))
        if tp is not None:
            # Every rank leaves together, and leaves at once: rank 1 aborted twice in CI under
            # load ("terminate called without an active exception", SIGABRT), once after the
            # barrier was added, never in dozens of local runs. Gloo's threads at the group's
            # teardown and at the interpreter's exit are where PyTorch knows that abort from; past
            # the barrier no collective is pending and rank 0 has written the result, so a rank
            # skips both. The stderr lines say how far each rank got should it abort again.
            print(f"rank {rank}: measured", file=sys.stderr, flush=True)
            torch.distributed.barrier()
            print(f"rank {rank}: leaving", file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(0)
    finally:
        parallel.close()


def measure(engine: Engine, rows: Rows, tp, timer: Timer, ks: list[int], full: ModelArgs,
            dtype: torch.dtype, device: torch.device, b: int) -> dict:
    def timed() -> tuple[float, dict[int, float]]:
        return (timer(lambda: rows.verify(engine, 0)),
                {k: timer(lambda k=k: rows.verify(engine, k)) for k in ks})

    step, verify = timed()
    row = {"step_ms": step, "verify_ms": verify,
           "verify_steps": {k: v / step for k, v in verify.items()}}
    if tp is None:
        return row
    # The same calls with each collective a local no-op (wrong numbers, the same local work):
    # what is left is compute; the rest of the call is the collectives and the waits in them.
    world = tp.world
    tp.all_reduce = lambda x: x
    tp.gather_last = lambda x, size: torch.cat([x] * world, -1)[..., :size]
    try:
        local_step, local_verify = timed()
    finally:
        del tp.all_reduce, tp.gather_last
    x = torch.zeros(b, full.hidden_size, dtype=dtype, device=device)
    row.update(local_step_ms=local_step, local_verify_ms=local_verify,
               collective_share_step=1 - local_step / step,
               collective_share_verify={k: 1 - local_verify[k] / verify[k] for k in ks},
               all_reduce_ms=timer(lambda: tp.all_reduce(x)),
               all_reduces_per_forward=2 * full.num_layers + 1)
    return row


def _free_bytes() -> int:
    return torch.cuda.mem_get_info(0)[0]


def run_degree(world: int, opts: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/rank0.json"
        mp.spawn(_rank, args=(world, parallel_port(), opts, out), nprocs=world, join=True)
        return _int_keys(json.loads(Path(out).read_text()))


def _int_keys(tree):
    """JSON's string keys back to the batch sizes and K they were."""
    if not isinstance(tree, dict):
        return tree
    return {int(k) if k.isdigit() else k: _int_keys(v) for k, v in tree.items()}


def parallel_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table(results: dict, ks: list[int]) -> str:
    lines = []
    cols = ["degree", "batch", "step ms"] + [f"verify K={k} ms (steps)" for k in ks] + \
        ["collectives % of step", f"% of verify K={ks[-1]}", "one all_reduce ms",
         "step vs degree 1"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---:|" * len(cols))
    base = results.get("1", {}).get("batches", {})
    for degree, run in results.items():
        if "skipped" in run:
            lines.append(f"| {degree} | - | skipped: {run['skipped']} |" + " |" * (len(cols) - 3))
            continue
        for b, r in run["batches"].items():
            cells = [degree, str(b), f"{r['step_ms']:.3f}"]
            cells += [f"{r['verify_ms'][k]:.3f} ({r['verify_steps'][k]:.2f})" for k in ks]
            if "collective_share_step" in r:
                cells += [f"{100 * r['collective_share_step']:.1f}",
                          f"{100 * r['collective_share_verify'][ks[-1]]:.1f}",
                          f"{r['all_reduce_ms']:.4f}"]
            else:
                cells += ["-", "-", "-"]
            one = base.get(b)
            cells.append(f"{one['step_ms'] / r['step_ms']:.2f}x" if one else "-")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama-70b")
    ap.add_argument("--scale", type=float, default=1.0, help="make_random_pair.py's --scale")
    ap.add_argument("--vocab-size", type=int, help="override the preset's vocabulary")
    ap.add_argument("--layers", type=int, help="override the preset's depth (layer shape kept)")
    ap.add_argument("--degrees", type=_ints, default=[1, 2, 4])
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                    help="auto: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--batches", type=_ints, default=[1, 4, 16])
    ap.add_argument("--ks", type=_ints, default=[1, 2, 4, 8], help="drafts per verification")
    ap.add_argument("--context", type=int, default=512, help="cached tokens per row")
    ap.add_argument("--calls", type=int, default=20, help="timed calls per figure (median)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank on the CPU")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    args.ks = sorted(set(args.ks))
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.dtype == "auto":
        args.dtype = "bfloat16" if args.device == "cuda" else "float32"
    full = model_args(args)
    dtype = getattr(torch, args.dtype)
    opts = {k: v for k, v in vars(args).items() if k != "json"}
    results = {"preset": args.preset, "scale": args.scale, "layers": full.num_layers,
               "hidden_size": full.hidden_size, "heads": full.num_heads,
               "kv_heads": full.num_kv_heads, "vocab_size": full.vocab_size,
               "device": args.device, "dtype": args.dtype, "context": args.context,
               "calls": args.calls, "cuda_graphs": False, "machine": machine(),
               "git": git_state(), "degrees": {}}
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    for world in args.degrees:
        try:
            parallel.layout(full, 0, world, f"preset {args.preset}")
        except ValueError as e:
            results["degrees"][str(world)] = {"skipped": str(e)}
            print(f"degree {world}: skipped: {e}", file=sys.stderr, flush=True)
            continue
        need = rank_bytes(full, dtype, world, max(args.batches),
                          args.context + max(args.ks) + 2)
        skip = None
        if args.device == "cuda" and world > gpus:
            skip = f"{world} ranks, {gpus} GPU(s) visible"
        elif args.device == "cuda" and need > _free_bytes():
            skip = (f"a rank needs {need / 2**30:.1f} GiB (weights and KV), "
                    f"{_free_bytes() / 2**30:.1f} GiB free on cuda:0")
        if skip:
            results["degrees"][str(world)] = {"skipped": skip, "rank_bytes": need}
            print(f"degree {world}: skipped: {skip}", file=sys.stderr, flush=True)
            continue
        t0 = time.perf_counter()
        batches = run_degree(world, opts)
        results["degrees"][str(world)] = {"rank_bytes": need, "batches": batches}
        print(f"degree {world}: {time.perf_counter() - t0:.0f} s, {need / 2**30:.2f} GiB a rank",
              file=sys.stderr, flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(f"{args.preset}: {full.num_layers} layers, hidden {full.hidden_size}, "
          f"{full.num_heads} heads / {full.num_kv_heads} KV, vocabulary {full.vocab_size}; "
          f"{args.device} {args.dtype}, context {args.context}, CUDA graphs off")
    print(table(results["degrees"], args.ks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
