"""Side-by-side served comparisons, each setting through a real tritonserver of its scenario's own,
greedy, client-side over gRPC streaming: does the adaptive draft length (specdec/planning/policy.py)
never lose, and where do prompt lookup and hybrid proposals (specdec/proposers/ngram.py) pay?

Scenarios (every setting runs `--repeats` times, interleaved, so a slow minute of a shared
machine does not land on one setting):
  poor     the default target with an untrained draft of the default draft's shape
           (benchmarks/untrained_draft.py, acceptance near 0): K=0, auto, K=4 at 1 and 4 streams
  default  the default pair: K=0, auto and fixed K=2,4,6,8 at 1 stream; K=0 and auto at 16
  capped   the default pair under the earlier fixed load policy (spec_full_below=8,
           spec_off_at=32): K=4 (its default) and K=8 at 16 streams
  repeat   prompts that ask for text to be repeated (--repeat-prompts): target-only, the draft
           model, prompt lookup and hybrid (each auto) at 1 and 4 streams
  free     free generation (--prompts-file): the same four settings
  eagle    the default pair with an EAGLE-3 head beside it (--eagle-head, SPECDEC_EAGLE_HEAD):
           target-only, the draft model and the head, each auto and K=2,4,6, at 1 stream;
           target-only, each auto and K=2,4 at 16 streams (--load-streams, --load-ks); hybrid
           auto (lookup, head and draft model per round; a server with a head defaulted to it
           before it measured below the head alone) at both
  hybrid   the default pair's own default proposer (lookup where it has a match, else the
           draft model, chosen per round): target-only, hybrid auto and K=2,4,6 at 1 stream;
           target-only, hybrid auto and K=2,4 at 16 streams (--prompts-file picks the workload;
           --load-streams and --load-ks the second part's streams and fixed K)
  self     SWIFT, the target drafting with layers skipped (--self-skip, SPECDEC_SELF_SKIP):
           target-only, self auto and K=2,4 at 1 stream; target-only, self auto and --load-ks
           at --load-streams
  medusa   Medusa-1 heads (--medusa, SPECDEC_MEDUSA_HEADS): the same settings
poor, default and capped draft with the draft model only (proposer=draft), so they show the
policy alone.

Per setting: tokens/s (one stream: per-request mean; more: aggregate), the ratio to target-only
in the same scenario, acceptance, k drafted per round and the share proposed by lookup, the
distribution of the k the policy chose and why rounds drafted nothing (server metric deltas),
and whether every output equals target-only's.

    .venv/bin/python benchmarks/compare.py [--scenarios poor,default,capped,repeat,free]
"""
from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from clients import run_requests
from figures import latency_summary
from inputs import DEFAULT_DRAFT, DEFAULT_PROMPTS, DEFAULT_TARGET, ROOT, load_prompts
from machine import git_state, machine
from progress import log
from server import (Server, acceptance_rate, drafted_per_round, exit_on_sigterm, settle_metrics,
                    tokens_per_round)
from untrained_draft import make as make_untrained
from workloads import REPEATING

from specdec.records import AUTO, Off

OLD_LOAD_POLICY = {"SPECDEC_SPEC_FULL_BELOW": "8", "SPECDEC_SPEC_OFF_AT": "32"}
CHOSEN, OFF = "specdec_chosen_draft_tokens_bucket", "specdec_speculation_off_rounds_total"
DRAFTED = "specdec_draft_tokens_total"
AT = ("specdec_drafted_at_position_total", "specdec_accepted_at_position_total")


@dataclass(frozen=True)
class Setting:
    k: int                     # num_draft_tokens: 0 target-only, AUTO, or fixed
    proposer: str = "draft"    # draft, ngram, eagle, self, medusa or hybrid

    @property
    def label(self) -> str:
        if self.k == 0:
            return "target-only"
        k = "auto" if self.k == AUTO else f"K={self.k}"
        return k if self.proposer == "draft" else f"{self.proposer} {k}"


TARGET_ONLY = Setting(0)
PROPOSERS = [TARGET_ONLY, Setting(AUTO), Setting(AUTO, "ngram"), Setting(AUTO, "hybrid")]


def chosen_k(before: dict, after: dict) -> dict[str, float]:
    """Rounds per chosen k (histogram bucket deltas, cumulative -> per value)."""
    cum = {le: after.get(le, 0.0) - before.get(le, 0.0) for le in after}
    keys = sorted((float(le), le) for le in cum if le != "+Inf")
    out, below = {}, 0.0
    for value, le in keys:
        out[str(int(value))] = cum[le] - below
        below = cum[le]
    return out


def _delta(before: dict, after: dict) -> dict[str, float]:
    return {key: n - before.get(key, 0.0) for key, n in after.items()}


def by_position(before: tuple[dict, dict], after: tuple[dict, dict]) -> list[float]:
    """Acceptance at draft positions 1, 2, ...: rounds that accepted position j over rounds
    that drafted it (the server's counters, every proposer summed), while any drafted it."""
    drafted, accepted = (_delta(b, a) for b, a in zip(before, after))
    out = []
    for j in sorted(int(p) for p in drafted):
        if drafted[str(j)] <= 0:
            break
        out.append(accepted.get(str(j), 0.0) / drafted[str(j)])
    return out


def run_setting(server: Server, prompts: list[str], setting: Setting, streams: int,
                requests: int, max_tokens: int) -> dict:
    batch = [(i, prompts[i % len(prompts)]) for i in range(requests)]
    k, proposer = setting.k, setting.proposer
    run_requests(server.grpc_url, batch[:streams], k, max_tokens, streams, "warm-up", False,
                 proposer)
    before = server.metrics()
    hist, off, by = (server.by_label(CHOSEN, "le"), server.by_label(OFF, "reason"),
                     server.by_label(DRAFTED, "proposer"))
    at = tuple(server.by_label(name, "position") for name in AT)
    reqs, wall = run_requests(server.grpc_url, batch, k, max_tokens, streams,
                              f"{setting.label} x{streams}", False, proposer)
    d = settle_metrics(server, before, sum(r.tokens for r in reqs))
    s = latency_summary(reqs)
    drafted = _delta(by, server.by_label(DRAFTED, "proposer"))
    total = sum(drafted.values())
    return {"tokens_per_s": s["tokens_per_s"] if streams == 1 else s["output_tokens"] / wall,
            "output_tokens": s["output_tokens"], "ttft_p50_s": s["ttft_p50_s"],
            "acceptance_rate": acceptance_rate(d), "k_per_round": drafted_per_round(d),
            "tokens_per_round": tokens_per_round(d),
            "acceptance_by_position": by_position(at, tuple(server.by_label(name, "position")
                                                            for name in AT)),
            "lookup_share": drafted.get("ngram", 0.0) / total if total else None,
            "rounds": d.get("specdec_rounds_total"),
            # From the server's counter: 1 a round with the head, 2 with the draft model.
            "bls_calls_per_round": (d.get("specdec_bls_calls_total", 0.0)
                                    / d["specdec_rounds_total"]
                                    if d.get("specdec_rounds_total") else None),
            "rounds_off": (rounds_off := _delta(off, server.by_label(OFF, "reason"))),
            # The histogram holds the rounds that drafted; those that chose 0 are the off rounds.
            "chosen_k": {"0": sum(rounds_off.values()),
                         **chosen_k(hist, server.by_label(CHOSEN, "le"))},
            "texts": [r.text for r in reqs]}


def scenario(name: str, draft: Path, env: dict, plan: list[tuple[Setting, int]], args,
             prompts: list[str]) -> list[dict]:
    """plan: (setting, streams); returns one row per entry, repeats aggregated."""
    runs: dict[tuple[Setting, int], list[dict]] = {p: [] for p in plan}
    with Server(args.target, draft, max_sequences=16, env=env) as server:
        for rep in range(args.repeats):
            for setting, streams in plan:
                r = run_setting(server, prompts, setting, streams, max(args.requests, streams),
                                args.max_tokens)
                runs[(setting, streams)].append(r)
                log(f"{name} {setting.label} x{streams} [{rep + 1}/{args.repeats}]: "
                    f"{r['tokens_per_s']:.1f} tok/s, k/round {r['k_per_round'] or 0:.2f}")
    rows = []
    for (setting, streams), rs in runs.items():
        base = runs.get((TARGET_ONLY, streams))
        tps = [r["tokens_per_s"] for r in rs]
        row = {"scenario": name, "setting": setting.label, "k": setting.k,
               "proposer": setting.proposer, "streams": streams,
               "tokens_per_s": sum(tps) / len(tps), "tokens_per_s_runs": tps,
               "acceptance_rate": rs[-1]["acceptance_rate"], "lookup_share": rs[-1]["lookup_share"],
               "k_per_round": sum(r["k_per_round"] or 0 for r in rs) / len(rs),
               "tokens_per_round": rs[-1]["tokens_per_round"],
               "acceptance_by_position": rs[-1]["acceptance_by_position"],
               "bls_calls_per_round": rs[-1]["bls_calls_per_round"],
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
    lines = [f"## Served comparisons, {report['date']}", "", f"`{report['command']}`", "",
             f"Machine: {report['machine'].get('gpu') or report['machine']['cpu']} "
             f"({report['machine']['cpu_count']} CPUs); commit {report['git'].get('commit')}; "
             f"{report['config']['requests']} requests x {report['config']['max_tokens']} tokens "
             f"per setting and repeat, {report['config']['repeats']} repeats, greedy.", "",
             "| scenario | setting | streams | tok/s | vs target-only | runs | accept | "
             "by position | k/round | tokens/round | lookup | BLS calls/round | "
             "chosen k (rounds) | off: acceptance / down / cap / no match | same text |",
             "|---|---|---:|---:|---:|---|---:|---|---:|---:|---:|---:|---|---|---|"]
    for r in report["rows"]:
        dist = " ".join(f"{k}:{int(n)}" for k, n in sorted(r["chosen_k"].items(),
                                                          key=lambda kv: int(kv[0])) if n)
        off = r["rounds_off"]
        acc = "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        share = "-" if r["lookup_share"] is None else f"{r['lookup_share']:.0%}"
        calls = "-" if r.get("bls_calls_per_round") is None else \
            f"{r['bls_calls_per_round']:.2f}"
        at = " / ".join(f"{a:.2f}" for a in r.get("acceptance_by_position") or []) or "-"
        per_round = "-" if r.get("tokens_per_round") is None else f"{r['tokens_per_round']:.2f}"
        lines.append(
            f"| {r['scenario']} | {r['setting']} | {r['streams']} | {r['tokens_per_s']:.1f} | "
            f"{r.get('vs_target_only', 0):.2f} | "
            f"{' / '.join(f'{x:.0f}' for x in r['tokens_per_s_runs'])} | {acc} | {at} | "
            f"{r['k_per_round']:.2f} | {per_round} | {share} | {calls} | {dist or '-'} | "
            f"{' / '.join(str(int(off.get(x, 0))) for x in Off)}"
            f" | {r['same_text_as_target_only']} |")
    return "\n".join(lines) + "\n"


def plans(name: str, args, tmp: Path) -> tuple[Path, dict, list[tuple[Setting, int]], Path]:
    """(draft, server env, settings x streams, prompts file) of a scenario."""
    draft, env, prompts = args.draft, {}, args.prompts_file
    if name == "poor":
        draft = make_untrained(args.draft, tmp / "untrained")
        plan = [(Setting(k), s) for s in (1, 4) for k in (0, AUTO, 4)]
    elif name == "default":
        plan = [(Setting(k), 1) for k in (0, AUTO, 2, 4, 6, 8)] + [
            (TARGET_ONLY, 16), (Setting(AUTO), 16)]
    elif name == "capped":
        env, plan = OLD_LOAD_POLICY, [(Setting(4), 16), (Setting(8), 16)]
    elif name == "eagle":
        if not (args.eagle_head / "config.json").is_file():
            raise SystemExit(f"--eagle-head {args.eagle_head}: no head there (make one with "
                             f"specdec distill --method eagle3)")
        env = {"SPECDEC_EAGLE_HEAD": str(args.eagle_head)}
        # hybrid auto: the head against lookup and the draft model chosen per round
        plan = [(TARGET_ONLY, 1)] + [(Setting(k, p), 1) for p in ("draft", "eagle")
                                     for k in (AUTO, 2, 4, 6)] + [(Setting(AUTO, "hybrid"), 1)]
        n = args.load_streams
        plan += [(TARGET_ONLY, n)] + [(Setting(k, p), n) for p in ("draft", "eagle")
                                      for k in (AUTO, *args.load_ks)] + [
            (Setting(AUTO, "hybrid"), n)]
    elif name in ("self", "medusa"):
        if name == "medusa" and not (args.medusa and args.medusa.is_dir()):
            raise SystemExit("the medusa scenario needs --medusa HEADS (specdec distill "
                             "--method medusa)")
        env = ({"SPECDEC_SELF_SKIP": args.self_skip} if name == "self"
               else {"SPECDEC_MEDUSA_HEADS": str(args.medusa)})
        n = args.load_streams
        plan = [(TARGET_ONLY, 1)] + [(Setting(k, name), 1) for k in (AUTO, 2, 4)] + [
            (TARGET_ONLY, n)] + [(Setting(k, name), n) for k in (AUTO, *args.load_ks)]
    elif name == "hybrid":
        plan = [(TARGET_ONLY, 1)] + [(Setting(k, "hybrid"), 1) for k in (AUTO, 2, 4, 6)]
        n = args.load_streams
        plan += [(TARGET_ONLY, n)] + [(Setting(k, "hybrid"), n) for k in (AUTO, *args.load_ks)]
    elif name in ("repeat", "free"):
        plan = [(s, n) for n in (1, 4) for s in PROPOSERS]
        prompts = args.repeat_prompts if name == "repeat" else args.prompts_file
    else:
        raise SystemExit(f"--scenarios: unknown scenario {name!r}")
    return draft, env, plan, prompts


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--draft", type=Path, default=DEFAULT_DRAFT)
    ap.add_argument("--eagle-head", type=Path, default=DEFAULT_TARGET.parent / "eagle",
                    help="the eagle scenario's head (default: the shipped one)")
    ap.add_argument("--self-skip", default="2,4",
                    help="the self scenario's skipped layers (SPECDEC_SELF_SKIP; specdec tune "
                         "--self finds them)")
    ap.add_argument("--medusa", type=Path, help="the medusa scenario's Medusa-1 heads")
    ap.add_argument("--scenarios", default="poor,default,capped,repeat,free")
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--repeat-prompts", type=Path, default=REPEATING)
    ap.add_argument("--requests", type=int, default=16, help="per setting and repeat")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--load-streams", type=int, default=16,
                    help="eagle and hybrid: the streams of the second part (default 16)")
    ap.add_argument("--load-ks", default="2,4",
                    help="eagle and hybrid: its fixed K, comma-separated (default 2,4)")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "compare.json")
    args = ap.parse_args(argv)
    try:
        args.load_ks = tuple(int(k) for k in args.load_ks.split(","))
    except ValueError:
        ap.error(f"--load-ks {args.load_ks!r}: comma-separated integers")
    if args.load_streams < 1 or not args.load_ks or min(args.load_ks) < 1:
        ap.error("--load-streams and every --load-ks must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    started = time.time()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.scenarios.split(","):
            draft, env, plan, prompts_file = plans(name, args, Path(tmp))
            prompts = load_prompts(prompts_file, 64, strict=False)
            rows += scenario(name, draft, env, plan, args, prompts)
    for r in rows:   # texts are compared above; the report keeps the figures
        r.pop("texts", None)
    report = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="minutes"),
              "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
              "machine": machine(), "git": git_state(),
              "config": {"requests": args.requests, "max_tokens": args.max_tokens,
                         "repeats": args.repeats, "load_streams": args.load_streams,
                         "load_ks": list(args.load_ks), "target": str(args.target),
                         "draft": str(args.draft)},
              "elapsed_s": time.time() - started, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(markdown(report))
    log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
