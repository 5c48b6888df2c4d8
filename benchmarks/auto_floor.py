"""Does auto ever lose? Each proposer under auto against target-only, served, where it does not
pay: the default target with drafters that accept next to nothing, at 1 and 16 streams.

Cases (each a tritonserver of its own; greedy; the settings alternate request by request at
one stream, batch by batch at more):
  draft    an untrained draft of the default draft's shape (untrained_draft.py)
  pard     the same draft as a parallel draft (config.json naming a mask token)
  self     SWIFT skipping 4 of the target's 6 layers (SPECDEC_SELF_SKIP=1,2,3,4)
  medusa   Medusa-1 heads as `specdec distill --method medusa --steps 0` starts them
  eagle    an EAGLE-3 head as `specdec distill --method eagle3 --steps 0` starts it

Per case and stream count: auto over target-only in tokens per second of wall time (medians,
and the median of each repeat's pair) and per CPU second of the server's processes (steadier
than wall time on a shared machine), and what auto drafted.

    .venv/bin/python benchmarks/auto_floor.py        # about 20 minutes on 2 CPU cores
    .venv/bin/python benchmarks/auto_floor.py --cases draft,self --repeats 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from clients import run_requests
from inputs import DEFAULT_DRAFT, DEFAULT_PROMPTS, DEFAULT_TARGET, load_prompts
from machine import write_result
from progress import log
from server import Server, metric_delta
from untrained_draft import make as make_untrained

from specdec import cli

CASES = ("draft", "pard", "self", "medusa", "eagle")
# --steps 0: what each method starts from; the data options only keep its run short.
TINY = ["--steps", "0", "--gen-sequences", "8", "--gen-tokens", "8", "--prompt-tokens", "8",
        "--seq-len", "32", "--eval-prompts", "2", "--eval-tokens", "8", "--max-k", "4",
        "--device", "cpu"]


def setup(case: str, work: Path) -> tuple[dict, Path | None, str]:
    """(server env, draft directory or None for the default's, proposer) for a case."""
    if case in ("draft", "pard"):
        draft = make_untrained(DEFAULT_DRAFT, work / case)
        if case == "pard":   # the vocabulary's last id as its mask
            cfg = json.loads((draft / "config.json").read_text())
            cfg["pard_token"] = cfg["vocab_size"] - 1
            (draft / "config.json").write_text(json.dumps(cfg))
        return {}, draft, "draft"
    if case == "self":
        return {"SPECDEC_SELF_SKIP": "1,2,3,4"}, None, "self"
    if case in ("medusa", "eagle"):
        out = work / case
        method = "medusa" if case == "medusa" else "eagle3"
        if cli.main(["distill", "--method", method, "--target", str(DEFAULT_TARGET), "--out",
                     str(out), "--overwrite", *TINY]):
            raise SystemExit(f"specdec distill --method {method} failed")
        key = "SPECDEC_MEDUSA_HEADS" if case == "medusa" else "SPECDEC_EAGLE_HEAD"
        return {key: str(out)}, None, case
    raise ValueError(case)


def run_case(case: str, work: Path, texts: list[str], streams: list[int], repeats: int,
             max_tokens: int) -> list[dict]:
    env, draft, proposer = setup(case, work)
    rows = []
    kwargs = {"draft": draft} if draft else {}
    with Server(env=env, **kwargs) as server:
        # A server that has seen the drafter not pay, as one serving for a while has: the
        # prompts once under auto (its acceptance learned, the costs measured).
        run_requests(server.grpc_url, list(enumerate(texts)), -1, max_tokens, 1, "warm-up",
                     progress=False, proposer=proposer)
        for n in streams:
            prompts = list(enumerate(texts * (1 if n == 1 else 4)))
            speed: dict[int, list[float]] = {0: [], -1: []}
            per_cpu: dict[int, list[float]] = {0: [], -1: []}
            drafted, rounds = [], []
            for r in range(repeats):
                # One stream: the settings alternate request by request (a minute of a busy
                # neighbour lands on both); more: batch by batch.
                pieces = [[p] for p in prompts] if n == 1 else [prompts]
                totals = {k: [0, 0.0, 0.0] for k in (0, -1)}   # tokens, wall s, CPU s
                for i, piece in enumerate(pieces):
                    for k in ((0, -1) if (i + r) % 2 == 0 else (-1, 0)):
                        before, cpu = server.metrics(), sum(server.cpu_seconds().values())
                        reqs, wall = run_requests(server.grpc_url, piece, k, max_tokens, n,
                                                  f"{case} {n}", progress=False,
                                                  proposer=proposer)
                        cpu = sum(server.cpu_seconds().values()) - cpu
                        t = totals[k]
                        t[0] += sum(q.tokens for q in reqs)
                        t[1] += wall
                        t[2] += cpu
                        if k == -1:
                            d = metric_delta(before, server.metrics())
                            drafted.append(int(d.get("specdec_draft_tokens_total", 0)))
                            rounds.append(int(d.get("specdec_rounds_total", 0)))
                for k, (tokens, wall, cpu) in totals.items():
                    speed[k].append(tokens / wall)
                    per_cpu[k].append(tokens / max(cpu, 1e-9))
                    log(f"{case}, {n} streams, repeat {r + 1}, "
                        f"{'auto' if k else 'target-only'}: {speed[k][-1]:.1f} tok/s")
            ratios = [a / b for a, b in zip(speed[-1], speed[0])]
            rows.append({"case": case, "streams": n, "tokens_per_s": speed,
                         "tokens_per_cpu_s": per_cpu,
                         "cpu_ratio_median": statistics.median(per_cpu[-1]) / statistics.median(
                             per_cpu[0]),
                         "ratio_median": statistics.median(speed[-1]) / statistics.median(
                             speed[0]),
                         "ratios": ratios, "auto_drafted": drafted, "auto_rounds": rounds})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", type=Path, default=Path("reports/auto_floor.json"))
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        ap.error(f"--cases: unknown {unknown}; choose from {', '.join(CASES)}")
    texts = load_prompts(DEFAULT_PROMPTS, args.prompts)
    streams = [int(s) for s in args.streams.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            rows += run_case(case, Path(tmp), texts, streams, args.repeats, args.max_tokens)
    print("\n| proposer (does not pay) | streams | auto / target-only, tok/s (medians) | "
          "median of paired ratios | tok per server CPU s | each repeat (tok/s) | auto's "
          "drafted tokens / rounds |")
    print("|---|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['streams']} | {r['ratio_median']:.3f}x | "
              f"{statistics.median(r['ratios']):.3f}x | {r['cpu_ratio_median']:.3f}x | "
              f"{' '.join(f'{x:.2f}' for x in r['ratios'])} | "
              f"{sum(r['auto_drafted'])} / {sum(r['auto_rounds'])} |")
    write_result(args.json, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
