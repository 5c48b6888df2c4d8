"""Does the adaptive draft length (specdec/policy.py) never lose? Auto against target-only and
fixed K, each through its own real tritonserver, greedy, client-side over gRPC streaming.

Scenarios (each a server of its own; every setting runs `--repeats` times, interleaved, so a
slow minute of a shared machine does not land on one setting):
  poor     the default target with an untrained draft of the default draft's shape
           (benchmarks/untrained_draft.py, acceptance near 0): K=0, auto, K=4 at 1 and 4 streams
  default  the default pair: K=0, auto and fixed K=2,4,6,8 at 1 stream; K=0 and auto at 16
  capped   the default pair under the earlier fixed load policy (spec_full_below=8,
           spec_off_at=32): K=4 (its default) and K=8 at 16 streams

Per setting: tokens/s (one stream: per-request mean; more: aggregate), the ratio to target-only
in the same scenario, acceptance, k drafted per round, the distribution of the k the policy
chose and why rounds drafted nothing (server metric deltas).

    .venv/bin/python benchmarks/policy_bench.py [--scenarios poor,default,capped] [--out FILE]
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path

from clients import run_requests
from figures import latency_summary
from inputs import DEFAULT_DRAFT, DEFAULT_PROMPTS, DEFAULT_TARGET, ROOT, load_prompts
from machine import git_state, machine
from progress import log
from server import Server, acceptance_rate, drafted_per_round, exit_on_sigterm, settle_metrics
from untrained_draft import make as make_untrained

AUTO = -1   # num_draft_tokens: chosen per round by the server
OLD_LOAD_POLICY = {"SPECDEC_SPEC_FULL_BELOW": "8", "SPECDEC_SPEC_OFF_AT": "32"}


def label(k: int) -> str:
    return "auto" if k == AUTO else ("target-only" if k == 0 else f"K={k}")


CHOSEN, OFF = "specdec_chosen_draft_tokens_bucket", "specdec_speculation_off_rounds_total"


def chosen_k(before: dict, after: dict) -> dict[str, float]:
    """Rounds per chosen k (histogram bucket deltas, cumulative -> per value)."""
    cum = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    keys = sorted((float(le), le) for le in cum if le != "+Inf")
    out, below = {}, 0.0
    for value, le in keys:
        out[str(int(value))] = cum[le] - below
        below = cum[le]
    return out


def run_setting(server: Server, prompts: list[str], k: int, streams: int, requests: int,
                max_tokens: int) -> dict:
    batch = [(i, prompts[i % len(prompts)]) for i in range(requests)]
    run_requests(server.grpc_url, batch[:streams], k, max_tokens, streams, "warm-up", False)
    before, hist, off = server.metrics(), server.by_label(CHOSEN, "le"), server.by_label(OFF, "reason")
    reqs, wall = run_requests(server.grpc_url, batch, k, max_tokens, streams,
                              f"{label(k)} x{streams}", False)
    d = settle_metrics(server, before, sum(r.tokens for r in reqs))
    s = latency_summary(reqs)
    off_after = server.by_label(OFF, "reason")
    return {"tokens_per_s": s["tokens_per_s"] if streams == 1 else s["output_tokens"] / wall,
            "output_tokens": s["output_tokens"], "ttft_p50_s": s["ttft_p50_s"],
            "acceptance_rate": acceptance_rate(d), "k_per_round": drafted_per_round(d),
            "rounds": d.get("specdec_rounds_total"),
            "rounds_off": {r: n - off.get(r, 0.0) for r, n in off_after.items()},
            "chosen_k": chosen_k(hist, server.by_label(CHOSEN, "le")),
            "texts": [r.text for r in reqs]}


def scenario(name: str, draft: Path, env: dict, plan: list[tuple[int, int]], args,
             prompts: list[str]) -> list[dict]:
    """plan: (k, streams) settings; returns one row per setting, repeats aggregated."""
    runs: dict[tuple[int, int], list[dict]] = {p: [] for p in plan}
    with Server(args.target, draft, max_sequences=16, env=env) as server:
        for rep in range(args.repeats):
            for k, streams in plan:
                r = run_setting(server, prompts, k, streams, max(args.requests, streams),
                                args.max_tokens)
                runs[(k, streams)].append(r)
                log(f"{name} {label(k)} x{streams} [{rep + 1}/{args.repeats}]: "
                    f"{r['tokens_per_s']:.1f} tok/s, k/round {r['k_per_round'] or 0:.2f}")
    rows = []
    for (k, streams), rs in runs.items():
        base = runs.get((0, streams))
        tps = [r["tokens_per_s"] for r in rs]
        row = {"scenario": name, "setting": label(k), "k": k, "streams": streams,
               "tokens_per_s": sum(tps) / len(tps), "tokens_per_s_runs": tps,
               "acceptance_rate": rs[-1]["acceptance_rate"],
               "k_per_round": sum(r["k_per_round"] or 0 for r in rs) / len(rs),
               "chosen_k": _sum_dicts([r["chosen_k"] for r in rs]),
               "rounds_off": _sum_dicts([r["rounds_off"] for r in rs]),
               "same_text_as_target_only": None}
        if base:
            row["vs_target_only"] = row["tokens_per_s"] / (
                sum(r["tokens_per_s"] for r in base) / len(base))
            row["same_text_as_target_only"] = all(r["texts"] == base[0]["texts"] for r in rs)
        rows.append(row)
    return rows


def _sum_dicts(ds: list[dict]) -> dict:
    out: dict = {}
    for d in ds:
        for key, v in d.items():
            out[key] = out.get(key, 0.0) + v
    return out


def markdown(report: dict) -> str:
    lines = [f"## Adaptive draft length, {report['date']}", "", f"`{report['command']}`", "",
             f"Machine: {report['machine'].get('gpu') or report['machine']['cpu']} "
             f"({report['machine']['cpu_count']} CPUs); commit {report['git'].get('commit')}; "
             f"{report['config']['requests']} requests x {report['config']['max_tokens']} tokens "
             f"per setting and repeat, {report['config']['repeats']} repeats, greedy.", "",
             "| scenario | setting | streams | tok/s | vs target-only | runs | accept | "
             "k/round | chosen k (rounds) | off: acceptance / down / cap | same text |",
             "|---|---|---:|---:|---:|---|---:|---:|---|---|---|"]
    for r in report["rows"]:
        dist = " ".join(f"{k}:{int(n)}" for k, n in sorted(r["chosen_k"].items(),
                                                          key=lambda kv: int(kv[0])) if n)
        off = r["rounds_off"]
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        lines.append(
            f"| {r['scenario']} | {r['setting']} | {r['streams']} | {r['tokens_per_s']:.1f} | "
            f"{r.get('vs_target_only', 0):.2f} | "
            f"{' / '.join(f'{x:.0f}' for x in r['tokens_per_s_runs'])} | "
            f"{acc} | "
            f"{r['k_per_round']:.2f} | {dist or '-'} | "
            f"{off.get('acceptance', 0):.0f} / {off.get('draft_down', 0):.0f} / "
            f"{off.get('load_cap', 0):.0f} | {r['same_text_as_target_only']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--draft", type=Path, default=DEFAULT_DRAFT)
    ap.add_argument("--scenarios", default="poor,default,capped")
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--requests", type=int, default=16, help="per setting and repeat")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "policy_bench.json")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    prompts = load_prompts(args.prompts_file, 64, strict=False)
    started = time.time()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenarios.split(","):
            if name == "poor":
                draft = make_untrained(args.draft, Path(tmp) / "untrained")
                rows += scenario(name, draft, {}, [(k, s) for s in (1, 4) for k in (0, AUTO, 4)],
                                 args, prompts)
            elif name == "default":
                plan = [(k, 1) for k in (0, AUTO, 2, 4, 6, 8)] + [(0, 16), (AUTO, 16)]
                rows += scenario(name, args.draft, {}, plan, args, prompts)
            elif name == "capped":
                rows += scenario(name, args.draft, OLD_LOAD_POLICY, [(4, 16), (8, 16)], args,
                                 prompts)
            else:
                raise SystemExit(f"--scenarios: unknown scenario {name!r}")
    for r in rows:   # texts are compared above; the report keeps the figures
        r.pop("texts", None)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
              "machine": machine(), "git": git_state(),
              "config": {"requests": args.requests, "max_tokens": args.max_tokens,
                         "repeats": args.repeats, "target": str(args.target),
                         "draft": str(args.draft)},
              "elapsed_s": time.time() - started, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
