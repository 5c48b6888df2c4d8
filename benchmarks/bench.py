"""One benchmark run: Triton target-only vs speculative (per K) vs transformers, on one machine.

Starts its own tritonserver (the project's launcher, free loopback ports, its own backend
directory), sends every setting the same prompts with the same max_tokens at temperature 0, then
runs transformers' `generate` (target alone, and assisted by the draft) in this process on the
same prompts for the same number of tokens. Everything printed and written comes from this run.

The project's own engine and loop are also run in this process without Triton (K=0 and the
best K), to split the Triton per-call times into model compute and serving transport.

Per setting: single-stream output tokens/s, TTFT and inter-token latency p50/p99 (server
settings measured client-side over gRPC streaming; transformers settings from a streamer),
acceptance rate a and mean tokens per round (from the server's metric deltas), the measured
draft/target cost ratio c, the theoretical speedup S(a, c, K), efficiency = measured speedup / S,
and the time per round split into draft, verify and orchestration overhead. Then aggregate
throughput at several concurrencies for target-only and the best K.

    .venv/bin/python benchmarks/bench.py [--quick] [--target DIR --draft DIR] [--out FILE]

Progress goes to stderr; markdown tables to stdout; everything to the JSON file (--out).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import time
from dataclasses import asdict
from pathlib import Path

from clients import run_requests, server_request
from engine_runs import engine_runs
from figures import latency_summary, theoretical_speedup
from hf_runs import hf_rows, load_tokenizer
from inputs import DEFAULT_PROMPTS, ROOT, add_pair_arguments, load_prompts
from machine import git_state, load_snapshot, machine, versions
from model_sizes import kv_pool_bytes, param_count
from progress import T_START, log
from report import METHOD, markdown
from server import DRAFT, TARGET, Server, default_max_seq_len, exit_on_sigterm, settle_metrics, triton_split


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS,
                    help="JSON lines with a 'prompt' field, or a text file, one prompt per line")
    ap.add_argument("--prompts", type=int,
                    help="use the first N prompts (default 64, or all the file has)")
    ap.add_argument("--max-tokens", type=int, help="tokens per request (default 64)")
    ap.add_argument("--ks", help="speculative K values, comma-separated (default 1,2,4,6,8)")
    ap.add_argument("--concurrency", help="streams for the throughput runs (default 1,4,16)")
    ap.add_argument("--warmup", type=int, default=2, help="warm-up requests before each setting")
    ap.add_argument("--max-seq-len", type=int,
                    help="server KV slot length (default min(1024, max_position_embeddings))")
    ap.add_argument("--server-env", action="append", default=[], metavar="SPECDEC_KEY=VALUE",
                    help="extra server setting, repeatable (e.g. SPECDEC_SPEC_FULL_BELOW=64 "
                         "SPECDEC_SPEC_OFF_AT=65 to keep full K at any load)")
    ap.add_argument("--no-engine", action="store_true",
                    help="skip the in-process specdec engine runs (target-only and best K)")
    ap.add_argument("--no-hf", action="store_true", help="skip the in-process transformers runs")
    ap.add_argument("--quick", action="store_true",
                    help="development run: 4 prompts, max_tokens 32, K 2,4, concurrency 1,4")
    ap.add_argument("--startup-timeout", type=float, default=900.0)
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench.json")
    args = ap.parse_args(argv)
    args.prompts_explicit = args.prompts is not None
    quick = dict(prompts=4, max_tokens=32, ks="2,4", concurrency="1,4")
    full = dict(prompts=64, max_tokens=64, ks="1,2,4,6,8", concurrency="1,4,16")
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.ks = sorted({int(k) for k in str(args.ks).split(",") if k.strip()} - {0})
    if any("=" not in e or not e.startswith("SPECDEC_") for e in args.server_env):
        ap.error("--server-env takes SPECDEC_KEY=VALUE")
    args.server_env = dict(e.split("=", 1) for e in args.server_env)
    args.concurrency = sorted({int(c) for c in str(args.concurrency).split(",") if c.strip()})
    if min(args.concurrency) < 1 or args.prompts < 1 or args.max_tokens < 1:
        ap.error("--prompts, --max-tokens and --concurrency must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    from specdec.serving.settings import EngineSettings

    started = datetime.datetime.now(datetime.timezone.utc)
    engine = EngineSettings()                 # the server's auto device and dtype
    device, dtype = engine.torch_device(), engine.torch_dtype()
    max_seq_len = args.max_seq_len or default_max_seq_len(args.target, args.draft)
    max_sequences = max(args.concurrency)
    prompts = list(enumerate(load_prompts(args.prompts_file, args.prompts,
                                          strict=args.prompts_explicit)))
    log(f"{len(prompts)} prompts from {args.prompts_file}, max_tokens {args.max_tokens}, "
        f"K {args.ks}, concurrency {args.concurrency}, {device} {dtype}")

    report: dict = {
        "command": shlex.join(getattr(sys, "orig_argv", [sys.executable] + sys.argv)),
        "cwd": os.getcwd(),
        "date": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "git": git_state(),
        "versions": versions(),
        "config": {"target": str(args.target), "draft": str(args.draft),
                   "prompts_file": str(args.prompts_file), "prompts": len(prompts),
                   "max_tokens": args.max_tokens, "temperature": 0.0, "ks": args.ks,
                   "concurrency": args.concurrency, "warmup": args.warmup,
                   "device": str(device), "dtype": str(dtype), "max_sequences": max_sequences,
                   "max_seq_len": max_seq_len,
                   "target_params": param_count(args.target),
                   "draft_params": param_count(args.draft)},
        "method": METHOD,
    }

    report["load_at_start"] = load_snapshot()
    if report["load_at_start"]["other_tritonserver_processes"]:
        log(f"note: {report['load_at_start']['other_tritonserver_processes']} other tritonserver "
            f"process(es) running on this machine; figures may be disturbed")
    server = Server(args.target, args.draft, max_sequences, max_seq_len, args.server_env,
                    args.startup_timeout)
    report["server"] = {"startup_s": server.startup_s, "env": server.env,
                        "log": str(server.log_path)}
    single: list[dict] = []
    conc: list[dict] = []
    lengths: dict[int, int] = {}
    k0_texts: dict[int, str] = {}
    try:
        url = server.grpc_url
        k0_verify = None
        for k in [0] + args.ks:
            label = "triton target-only" if k == 0 else f"triton K={k}"
            for j in range(args.warmup):
                server_request(url, prompts[j % len(prompts)][1], -1, k, args.max_tokens)
            before = server.metrics()
            stats_before = server.model_stats()
            reqs, _ = run_requests(url, prompts, k, args.max_tokens, 1, label)
            d = settle_metrics(server, before, sum(r.tokens for r in reqs))
            stats_after = server.model_stats()
            row = {"setting": label, "k": k, "backend": "triton", **latency_summary(reqs)}
            rounds = d.get("specdec_rounds_total", 0)
            drafted = d.get("specdec_draft_tokens_total", 0)
            accepted = d.get("specdec_accepted_tokens_total", 0)
            draft_sum = d.get("specdec_draft_latency_seconds_sum", 0)
            verify_sum = d.get("specdec_verify_latency_seconds_sum", 0)
            verify_count = d.get("specdec_verify_latency_seconds_count", 0)
            if k == 0:
                k0_verify = verify_sum / verify_count
                for r in reqs:
                    lengths[r.prompt_index] = r.tokens
                    k0_texts[r.prompt_index] = r.text
            else:
                row["acceptance_rate"] = accepted / drafted if drafted else None
                row["c"] = (draft_sum / drafted) / k0_verify if drafted else None
                row["same_text_as_k0"] = sum(r.text == k0_texts.get(r.prompt_index) for r in reqs)
            row["tokens_per_round"] = (accepted + rounds) / rounds if rounds else None
            row["output_tokens_metric"] = d.get("specdec_output_tokens_total")
            row["finish_reasons"] = sorted({str(r.finish_reason) for r in reqs})
            wall = sum(r.total_s for r in reqs)
            row["round"] = {"rounds": int(rounds), "wall_s": wall / rounds,
                            "drafted_per_round": drafted / rounds,
                            "draft_s": draft_sum / rounds, "verify_s": verify_sum / rounds,
                            "overhead_s": (wall - draft_sum - verify_sum) / rounds,
                            "verify_call_s": verify_sum / verify_count,
                            "draft_call_s": (
                                draft_sum / d["specdec_draft_latency_seconds_count"]
                                if d.get("specdec_draft_latency_seconds_count") else None),
                            "verify_vs_k0": (verify_sum / verify_count) / k0_verify}
            row["bls_split"] = triton_split(stats_before, stats_after, {
                DRAFT: (draft_sum, d.get("specdec_draft_latency_seconds_count", 0)),
                TARGET: (verify_sum, verify_count)})
            row["metric_deltas"] = d
            row["per_request"] = [{**asdict(r), "text": None} for r in reqs]
            single.append(row)
            log(f"{label}: {row['tokens_per_s']:.1f} tok/s"
                + (f", a={row['acceptance_rate']:.3f}, c={row['c']:.3f}" if k else ""))
        base = single[0]["tokens_per_s"]
        for row in single:
            k = row["k"]
            row["speedup"] = row["tokens_per_s"] / base
            if k and row["acceptance_rate"] is not None and row["c"] is not None:
                a, c = row["acceptance_rate"], row["c"]
                row["theoretical_speedup"] = theoretical_speedup(a, c, k)
                row["efficiency"] = row["speedup"] / row["theoretical_speedup"]
                # The same cost model with the measured tokens per round instead of the i.i.d.
                # acceptance formula (acceptance is not i.i.d. across positions in practice).
                row["speedup_model_measured_tokens"] = row["tokens_per_round"] / (c * k + 1.0)
        spec = [r for r in single if r["k"]]
        best = max(spec, key=lambda r: r["tokens_per_s"])["k"] if spec else None
        report["best_k"] = best

        # Concurrency: target-only and the best K. Streams = 1 reuses the single-stream run.
        for k in [0] + ([best] if best else []):
            label = "triton target-only" if k == 0 else f"triton K={k}"
            for c in args.concurrency:
                if c == 1:
                    src = next(r for r in single if r["k"] == k)
                    conc.append({"setting": label, "k": k, "concurrency": 1,
                                 "requests": src["requests"], "output_tokens": src["output_tokens"],
                                 "aggregate_tokens_per_s": src["tokens_per_s"],
                                 **{x: src[x] for x in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s",
                                                        "itl_p50_s", "itl_p99_s")},
                                 "acceptance_rate": src.get("acceptance_rate"),
                                 "mean_k_drafted": src["round"]["drafted_per_round"],
                                 "note": "the single-stream run"})
                    continue
                n = max(len(prompts), c)
                batch = [(i, prompts[i % len(prompts)][1]) for i in range(n)]
                warm = [(i, prompts[i % len(prompts)][1]) for i in range(c)]
                log(f"{label} x{c}: warm-up ({c} concurrent requests)")
                run_requests(url, warm, k, args.max_tokens, c, f"{label} x{c} warm-up", False)
                before = server.metrics()
                reqs, wall = run_requests(url, batch, k, args.max_tokens, c, f"{label} x{c}")
                d = settle_metrics(server, before, sum(r.tokens for r in reqs))
                s = latency_summary(reqs)
                drafted = d.get("specdec_draft_tokens_total", 0)
                row = {"setting": label, "k": k, "concurrency": c, **s,
                       "aggregate_tokens_per_s": s["output_tokens"] / wall, "wall_s": wall,
                       "acceptance_rate": (d.get("specdec_accepted_tokens_total", 0) / drafted
                                           if drafted else None),
                       "rounds": d.get("specdec_rounds_total"),
                       "mean_k_drafted": (drafted / d["specdec_rounds_total"]
                                          if d.get("specdec_rounds_total") else None)}
                conc.append(row)
                log(f"{label} x{c}: {row['aggregate_tokens_per_s']:.1f} tok/s aggregate")
        report["memory"] = {"server": server.memory()}
        report["load_at_end"] = load_snapshot(server.proc.pid)
    finally:
        server.stop()

    report["single_stream"] = single
    report["concurrency"] = conc
    report["memory"]["kv_pool_bytes"] = kv_pool_bytes(args.target, args.draft, max_sequences,
                                                      max_seq_len, dtype)

    tok = load_tokenizer(args.target)
    report["engine"] = []
    if not args.no_engine:
        report["engine"] = engine_runs(args.target, args.draft, tok, prompts,
                                       [0] + ([report["best_k"]] if report.get("best_k") else []),
                                       args.max_tokens, max_seq_len, dtype, device, args.warmup)

    if not args.no_hf:
        single += hf_rows(args.target, args.draft, tok, prompts, lengths, k0_texts,
                          single[0]["tokens_per_s"], dtype, device, args.warmup)

    report["load_at_finish"] = load_snapshot()
    report["duration_s"] = time.monotonic() - T_START
    text = markdown(report)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(text, end="")
    log(f"wrote {args.out} ({report['duration_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
