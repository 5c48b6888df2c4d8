"""The server against transformers in alternation, on the CPU in float32 (the CPU goals):
one server and one set of transformers models, then N pairs of runs a few seconds apart, each a
served setting and transformers' own on the same prompts for the same token counts. On a shared
2-core machine the served side of bench.py drifted by a fifth within half an hour while
transformers held (docs/benchmarks.md): a ratio of two figures taken minutes apart is partly the
machine's. Here each ratio is of two runs that shared the machine's state, and the spread of N
of them is the figure's uncertainty.

    .venv/bin/python benchmarks/paired.py --k 8 --pairs 6 --prompts 32

Per pair: served target-only against `generate`, served draft K against assisted generation
(the order alternates pair to pair, so a drift favours neither side); then each ratio's median,
range and how many pairs met the CPU goals (0.9x `generate`, 1.5x assisted). Every output
is checked against the target's own: the served K run's text and transformers' decoded tokens
equal the served target-only run's; a run where any differs exits 1.

The served requests stream by default, a response a round, as a chat client asks; `generate`
returns its answer at the end. --no-stream asks the server the same (the ensemble's `stream`
off: one response a request), the like-for-like comparison.
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import statistics
import sys
from pathlib import Path

from clients import run_requests
from figures import latency_summary
from hf_runs import hf_load, hf_run
from inputs import (DEFAULT_PROMPTS, ROOT, add_pair_arguments, add_server_env_argument,
                    load_prompts, load_tokenizer)
from machine import git_state, load_snapshot, machine, versions
from progress import log
from server import Server, exit_on_sigterm

GOALS = {"target-only": 0.9, "speculative": 1.5}   # served / transformers


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_arguments(ap)
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=8,
                    help="the served draft's num_draft_tokens (-1: auto)")
    ap.add_argument("--pairs", type=int, default=6, help="pairs of runs for each comparison")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests for each side")
    ap.add_argument("--no-stream", dest="stream", action="store_false",
                    help="served answers in one response each, as `generate` returns them")
    add_server_env_argument(ap)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "paired.json")
    args = ap.parse_args(argv)
    if args.k == 0 or args.k < -1 or args.pairs < 1 or args.prompts < 1 or args.max_tokens < 1:
        ap.error("--k must be -1 (auto) or >= 1; --pairs, --prompts and --max-tokens >= 1")
    args.server_env = dict(args.server_env)
    return args


def order(pair: int) -> tuple[str, str]:
    """Which side runs first in pair `pair` (0-based): served on even pairs, transformers on
    odd ones."""
    return ("served", "transformers") if pair % 2 == 0 else ("transformers", "served")


def k_name(k: int) -> str:
    return "auto" if k == -1 else f"K={k}"


def summary(ratios: list[float], goal: float) -> dict:
    """The pairs' ratios (served / transformers) as median, range and how many met `goal`."""
    return {"ratios": ratios, "median": statistics.median(ratios), "min": min(ratios),
            "max": max(ratios), "goal": goal, "met": sum(r >= goal for r in ratios),
            "pairs": len(ratios)}


def main(argv=None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    import torch
    prompts = list(enumerate(load_prompts(args.prompts_file, args.prompts)))
    tok = load_tokenizer(args.target)
    cpu = torch.device("cpu")
    env = {"SPECDEC_DEFAULT_PROPOSER": "draft", **args.server_env}
    report: dict = {"command": shlex.join(sys.orig_argv), "machine": machine(),
                    "git": git_state(), "versions": versions(),
                    "date": datetime.datetime.now(datetime.timezone.utc).isoformat("T", "seconds"),
                    "config": {"prompts": len(prompts), "max_tokens": args.max_tokens,
                               "k": args.k, "pairs": args.pairs, "server_env": env,
                               "stream": args.stream},
                    "load_at_start": load_snapshot(), "pairs": []}
    target, draft = hf_load(args.target, torch.float32, cpu), hf_load(args.draft, torch.float32,
                                                                      cpu)
    with Server(args.target, args.draft, 1, env=env) as server:
        def served(k: int, label: str):
            reqs, _ = run_requests(server.grpc_url, prompts, k, args.max_tokens, 1, label,
                                   progress=False, stream=args.stream)
            return reqs

        for k in (0, args.k):
            run_requests(server.grpc_url, prompts[:args.warmup], k, args.max_tokens, 1,
                         "warm-up", progress=False, stream=args.stream)
        base = served(0, "served target-only")   # what every other run must reproduce
        lengths = {r.prompt_index: r.tokens for r in base}
        texts = {r.prompt_index: r.text for r in base}

        def transformers(assistant, label: str):
            return hf_run(label, target, tok, prompts, lengths, cpu, assistant, args.warmup,
                          lambda: None, progress=False)

        for pair in range(args.pairs):
            row: dict = {"pair": pair + 1, "first": order(pair)[0]}
            for name, k, assistant in (("target-only", 0, None), ("speculative", args.k, draft)):
                runs: dict = {}
                for side in order(pair):
                    if side == "served":
                        reqs = served(k, f"served {name}")
                        runs["served_same_text"] = sum(r.text == texts[r.prompt_index]
                                                       for r in reqs)
                    else:
                        reqs, outs = transformers(assistant, f"transformers {name}")
                        runs["transformers_same_text"] = sum(
                            tok.decode(o, skip_special_tokens=True) == texts[r.prompt_index]
                            for r, o in zip(reqs, outs))
                    runs[side] = latency_summary(reqs)["tokens_per_s"]
                runs["ratio"] = runs["served"] / runs["transformers"]
                row[name] = runs
            report["pairs"].append(row)
            log(f"pair {pair + 1}/{args.pairs}: target-only {row['target-only']['ratio']:.2f}x, "
                f"{k_name(args.k)} {row['speculative']['ratio']:.2f}x")
    report["load_at_end"] = load_snapshot()
    report["summary"] = {name: summary([p[name]["ratio"] for p in report["pairs"]], goal)
                         for name, goal in GOALS.items()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(markdown(report, len(prompts)), end="")
    log(f"wrote {args.out}")
    if differ(report, len(prompts)):
        print("an output differs from the target's own (the table's last column)",
              file=sys.stderr)
        return 1
    return 0


def differ(report: dict, n: int) -> bool:
    """Whether any run of any pair gave an output other than the target's own."""
    return any(p[name][key] != n for p in report["pairs"] for name in GOALS
               for key in ("served_same_text", "transformers_same_text"))


def markdown(report: dict, n: int) -> str:
    streamed = "streamed" if report["config"].get("stream", True) else "one response each"
    lines = [f"Served requests: {streamed}.", "",
             "| pair | first | served target-only tok/s | `generate` | ratio | "
             f"served {k_name(report['config']['k'])} | assisted | ratio | "
             "outputs equal to the target's |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for p in report["pairs"]:
        t, s = p["target-only"], p["speculative"]
        equal = (f"served {s['served_same_text']}/{n}, `generate` "
                 f"{t['transformers_same_text']}/{n}, assisted {s['transformers_same_text']}/{n}")
        lines.append(f"| {p['pair']} | {p['first']} | {t['served']:.1f} | {t['transformers']:.1f} "
                     f"| {t['ratio']:.2f}x | {s['served']:.1f} | {s['transformers']:.1f} "
                     f"| {s['ratio']:.2f}x | {equal} |")
    lines.append("")
    for name, s in report["summary"].items():
        lines.append(f"- {name}: median {s['median']:.3f}x (range {s['min']:.3f}-{s['max']:.3f}),"
                     f" {s['met']} of {s['pairs']} pairs at or above {s['goal']}x")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
