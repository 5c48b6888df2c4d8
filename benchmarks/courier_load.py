"""The orchestrator's courier under many streams of short requests: its CPU a request and a
response, beside the client's tok/s, time to first token and inter-token latency.

Every streamed response and every metric update leaves speculative_decoding from one thread
(specdec/serving/courier.py), a message to the server process each, shared by every stream. At
a GPU's pace that thread, not the engine, can set how fast responses go: at 16 streams of
target-only on an H200 about 1,600 responses a second. Its CPU is read from the OS by the
thread's name (schedstat, nanoseconds); short requests weigh what a request's start and end send.

    .venv/bin/python benchmarks/courier_load.py [--streams 16] [--prompts 64] [--max-tokens 32]
                                                [--runs 3] [--k -1] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clients import run_requests
from figures import latency_summary
from inputs import DEFAULT_PROMPTS, add_pair_arguments, add_server_env_argument, load_prompts
from progress import log
from server import ORCHESTRATOR, Server, exit_on_sigterm, thread_cpu_s

from specdec.launcher import procs
from specdec.serving.courier import THREAD_NAME


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_arguments(ap)
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3, help="times the prompts are sent")
    ap.add_argument("--k", type=int, default=-1, help="num_draft_tokens (-1: auto)")
    add_server_env_argument(ap)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    exit_on_sigterm()
    prompts = list(enumerate(load_prompts(args.prompts_file, args.prompts)))
    env = dict(args.server_env)
    with Server(args.target, args.draft, args.streams, env=env) as server:
        run_requests(server.grpc_url, prompts[:args.streams], args.k, 16, args.streams,
                     "warm-up", progress=False)
        pid = procs.server_processes(server.proc.pid)[ORCHESTRATOR]
        cpu0 = thread_cpu_s(pid, THREAD_NAME)
        reqs, wall = [], 0.0
        for run in range(args.runs):
            done, seconds = run_requests(server.grpc_url, prompts, args.k, args.max_tokens,
                                         args.streams, f"run {run + 1}/{args.runs}",
                                         progress=False)
            reqs += done
            wall += seconds
        courier_s = thread_cpu_s(pid, THREAD_NAME) - cpu0
    if not courier_s:
        raise SystemExit(f"no thread named {THREAD_NAME} in {ORCHESTRATOR}'s process")
    tokens = sum(r.tokens for r in reqs)
    responses = sum(len(r.chunk_times_s) for r in reqs)   # those that carried tokens
    lat = latency_summary(reqs)
    row = {"tok_s": tokens / wall, "courier_ms_per_request": courier_s / len(reqs) * 1e3,
           "courier_ms_per_response": courier_s / responses * 1e3,
           "courier_busy": courier_s / wall, "responses_per_request": responses / len(reqs),
           **{f"{k}_ms_p{q}": lat[f"{k}_p{q}_s"] * 1e3 for k in ("ttft", "itl") for q in (50, 99)}}
    log(f"{len(reqs)} requests, {tokens} tokens")
    print("| tok/s | courier ms a request | a response | busy | responses a request "
          "| TTFT ms p50 / p99 | ITL ms p50 / p99 |\n|---:|---:|---:|---:|---:|---|---|")
    print(f"| {row['tok_s']:.1f} | {row['courier_ms_per_request']:.2f} "
          f"| {row['courier_ms_per_response']:.3f} | {row['courier_busy']:.1%} "
          f"| {row['responses_per_request']:.1f} "
          f"| {row['ttft_ms_p50']:.1f} / {row['ttft_ms_p99']:.1f} "
          f"| {row['itl_ms_p50']:.2f} / {row['itl_ms_p99']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv, **row}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
