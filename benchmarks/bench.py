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
from pathlib import Path

from engine_runs import engine_runs
from hf_runs import hf_rows
from inputs import (DEFAULT_PROMPTS, ROOT, add_pair_arguments, add_server_env_argument,
                    load_prompts, load_tokenizer)
from machine import git_state, load_snapshot, machine, versions
from model_sizes import kv_pool_bytes, param_count
from progress import T_START, log
from report import METHOD, markdown
from server import Server, default_max_seq_len, exit_on_sigterm
from triton_runs import best_k, concurrency, single_stream


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
    add_server_env_argument(ap, "extra server setting, repeatable (e.g. "
                                "SPECDEC_SPEC_FULL_BELOW=64 SPECDEC_SPEC_OFF_AT=65 to keep full "
                                "K at any load)")
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
    args.server_env = dict(args.server_env)
    args.concurrency = sorted({int(c) for c in str(args.concurrency).split(",") if c.strip()})
    if min(args.concurrency) < 1 or args.prompts < 1 or args.max_tokens < 1:
        ap.error("--prompts, --max-tokens and --concurrency must be >= 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    exit_on_sigterm()
    from specdec.serving.engine_settings import EngineSettings

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
    with Server(args.target, args.draft, max_sequences, max_seq_len, env=args.server_env,
                startup_timeout_s=args.startup_timeout) as server:
        report["server"] = {"startup_s": server.startup_s, "env": server.env,
                            "log": str(server.log_path)}
        single, lengths, k0_texts = single_stream(server, prompts, args.ks, args.max_tokens,
                                                  args.warmup)
        report["best_k"] = best_k(single)
        compared = [0] + ([report["best_k"]] if report["best_k"] else [])
        # Target-only and the best K; one stream reuses the single-stream run.
        conc = concurrency(server, prompts, compared, args.concurrency, args.max_tokens, single)
        report["memory"] = {"server": server.memory()}
        report["load_at_end"] = load_snapshot(server.triton_pid)
    report["single_stream"] = single
    report["concurrency"] = conc
    report["memory"]["kv_pool_bytes"] = kv_pool_bytes(args.target, args.draft, max_sequences,
                                                      max_seq_len, dtype)

    tok = load_tokenizer(args.target)
    report["engine"] = []
    if not args.no_engine:
        report["engine"] = engine_runs(args.target, args.draft, tok, prompts, compared,
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
