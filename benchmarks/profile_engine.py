"""Where the engine's time goes: the in-process loop under torch.profiler, no Triton.

    .venv/bin/python benchmarks/profile_engine.py                 # default pair, K=6, 8 prompts
    .venv/bin/python benchmarks/profile_engine.py --k 0 --prompts 4 --top 40
    python3 benchmarks/profile_engine.py --device cuda --target /tmp/rp/target --draft /tmp/rp/draft

Prints tokens/s without the profiler, then the operators that take the most self time with it,
and how many operator calls one draft step, one target call and one round make. On CUDA
(bf16, CUDA graphs as served) the kernels that take the most GPU time too: where a round's
milliseconds go beside the graphs' replays.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import torch

from inputs import DEFAULT_PROMPTS, add_pair_arguments, prompt_ids

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.decoding.local import LocalDrafter, LocalVerifier
from specdec.decoding.loop import speculate
from specdec.records import Request


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--threads", type=int, default=0, help="torch threads, 0 = torch's default")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: bfloat16 and CUDA graphs, as served there; cpu: float32")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    prompts = prompt_ids(args.target, args.prompts_file, args.prompts)
    margs = ModelArgs.from_dir(args.target)
    dev = torch.device(args.device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    tgt = Engine.load(str(args.target), 1, 1024, dtype, dev, margs.vocab_size)
    drf = Engine.load(str(args.draft), 1, 1024, dtype, dev, margs.vocab_size)
    seq = iter(range(1, 1 << 62))

    def run_all():
        out = rounds = 0
        for ids in prompts:
            st = asyncio.run(speculate(next(seq), Request(ids, args.max_tokens, args.k,
                                                          eos=margs.eos_token_ids),
                                       LocalDrafter(drf), LocalVerifier(tgt), 1024,
                                       lambda chunk: None))
            out += st.num_output_tokens
            rounds += st.rounds
        return out, rounds

    run_all()  # warm-up
    t0 = time.perf_counter()
    out, rounds = run_all()
    wall = time.perf_counter() - t0
    print(f"K={args.k}: {out} tokens in {wall:.3f} s = {out / wall:.1f} tok/s, "
          f"{rounds} rounds, {wall / rounds * 1e3:.2f} ms/round, threads {torch.get_num_threads()}")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if dev.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        run_all()
    events = prof.key_averages()
    calls = sum(e.count for e in events if e.key.startswith("aten::"))
    print(f"aten operator calls per round (nested ones included): {calls / rounds:.0f}")
    print(events.table(sort_by="self_cpu_time_total", row_limit=args.top))
    if dev.type == "cuda":
        print(events.table(sort_by="self_device_time_total", row_limit=args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
