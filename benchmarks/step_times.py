"""How long one engine call takes when the process runs it back to back, and after idling.

In the server each model is its own process and waits while the other one works: the draft for
a target pass, the target for a draft proposal, both for the orchestrator. This times the same
calls in one process with a pause between them (sleep), to show what the pause alone costs.

    .venv/bin/python benchmarks/step_times.py                 # default pair, pauses 0, 1, 3, 10 ms
    .venv/bin/python benchmarks/step_times.py --k 8 --calls 300 --gaps-ms 0,3

Prints the median time of a draft proposal of K tokens, a target step (one token) and a target
verification of K drafts, per pause, alternating the pauses so that drift hits them all.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from inputs import add_pair_arguments

from specdec.runtime.engine import Engine
from specdec.records import ProposeCall, VerifyCall
from specdec.runtime.sampling import SamplingParams


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--calls", type=int, default=200, help="calls per pause and round")
    ap.add_argument("--rounds", type=int, default=3, help="passes over the pauses")
    ap.add_argument("--gaps-ms", default="0,1,3,10")
    ap.add_argument("--context", type=int, default=100, help="cached tokens before each call")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the server: 1 on 2 cores)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    gaps = [float(g) / 1e3 for g in args.gaps_ms.split(",")]
    greedy, cpu = SamplingParams(), torch.device("cpu")
    target = Engine.load(str(args.target), 1, args.context + args.k + 2, torch.float32, cpu)
    draft = Engine.load(str(args.draft), 1, args.context + args.k + 2, torch.float32, cpu,
                        vocab_size=target.vocab_size)
    prompt = [1 + i % (target.vocab_size - 1) for i in range(args.context)]
    draft.propose([ProposeCall(1, 0, prompt, 1, greedy)])
    target.verify([VerifyCall(1, 0, prompt, [], None, greedy)])
    n = args.context
    calls = {
        f"draft proposal, K={args.k}": lambda: draft.propose(
            [ProposeCall(1, n - 1, [prompt[-1]], args.k, greedy)]),
        "target step, 1 token": lambda: target.verify(
            [VerifyCall(1, n - 1, [prompt[-1]], [], None, greedy)]),
        f"target verification, K={args.k}": lambda: target.verify(
            [VerifyCall(1, n - 1, [prompt[-1]], [1] * args.k, None, greedy)]),
    }
    times = {(name, g): [] for name in calls for g in gaps}
    for r in range(args.rounds):
        for g in gaps:
            for name, call in calls.items():
                for _ in range(args.calls):
                    if g:
                        time.sleep(g)
                    t0 = time.perf_counter()
                    call()
                    times[(name, g)].append(time.perf_counter() - t0)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(f"threads {args.threads}, {args.context} cached tokens, median ms over "
          f"{args.rounds * args.calls} calls\n")
    print("| call | " + " | ".join(f"pause {g * 1e3:g} ms" for g in gaps) + " |")
    print("|---|" + "---:|" * len(gaps))
    for name in calls:
        row = [statistics.median(times[(name, g)]) * 1e3 for g in gaps]
        print(f"| {name} | " + " | ".join(f"{x:.2f}" for x in row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
