"""Suffix decoding against prompt lookup and against no speculation, served, on agent-like
traffic whose answers recur across requests; and on the held-out prompts, where it must not
lose. One server (the default pair), greedy, tokens per second over the wall time.

The agentic workload (`sessions`): sessions of several turns, each turn's prompt the tools'
JSON definitions, a file being edited (the held-out code, a line changed each turn), the
session's history (earlier turns' requests and the model's answers) and a new request naming a
tool call and a ticket of the session's own. Sessions draw their task from a small pool, as an
agent fleet runs the same tasks over and over, so answers recur across sessions.

Each setting's run is a tenant of its own (`SPECDEC_SUFFIX_TENANTS=separate`), so that every
run starts with an empty tree of earlier outputs and none learns from another's.

    .venv/bin/python benchmarks/agentic.py          # about a minute on 2 CPU cores
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

from inputs import DEFAULT_PROMPTS, DEFAULT_TARGET, load_prompts
from machine import write_result
from server import Server

from specdec import names
from specdec.openai.triton import SpecDecoding
from specdec.serving.tokenizer import load_tokenizer
from specdec_client import GenerationParams

TOOLS = json.dumps([{"name": n, "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}}}} for n in ("read_file", "write_file", "run_tests")])
ACTIONS = ("read_file", "write_file", "run_tests")
# (name, proposer, num_draft_tokens): -1 is auto, the default.
SETTINGS = (("target-only", "hybrid", 0), ("prompt lookup", "ngram", -1),
            ("suffix", "suffix", -1), ("hybrid (default)", "hybrid", -1))


def sessions(n: int, turns: int, tasks: int, seed: int = 0) -> list[list[str]]:
    """n sessions of `turns` requests each: a turn's text is completed by the answers of the
    turns before it (`{history}` is filled in as the session runs)."""
    files = load_prompts(DEFAULT_PROMPTS, tasks)
    rng = random.Random(seed)
    out = []
    for s in range(n):
        task = rng.randrange(tasks)
        ticket = rng.randrange(1000, 9999)
        lines = files[task].splitlines() or [files[task]]
        session = []
        for t in range(turns):
            edited = list(lines)
            edited[t % len(edited)] = edited[t % len(edited)] + f"  # turn {t}"
            session.append(f"# tools: {TOOLS}\n# file {task}.py\n" + "\n".join(edited) +
                           "\n{history}" + f"# ticket {ticket}: {ACTIONS[t % 3]}({task}.py)\n")
        out.append(session)
    return out


async def run_sessions(url: str, tokenizer, work: list[list[str]], streams: int,
                       params: GenerationParams, tenant: str) -> tuple[float, dict]:
    """Every session's turns in order, `streams` sessions at a time: (seconds, summed counts).
    A client of this event loop's own (a gRPC aio channel belongs to the loop it was made in)."""
    client = SpecDecoding(url, tokenizer)
    counts = {names.NUM_OUTPUT_TOKENS: 0, names.TOTAL_DRAFT_TOKENS: 0,
              names.TOTAL_ACCEPTED_DRAFT_TOKENS: 0}
    queue = list(work)

    async def one(turns: list[str]) -> None:
        history = ""
        for template in turns:
            answer = ""
            async for out in client.generate(template.replace("{history}", history), params,
                                             True, extra={names.TENANT: tenant}):
                answer += out.get(names.TEXT_OUTPUT, "")
                if out.get(names.FINISH_REASON):
                    for name in counts:
                        counts[name] += out.get(name) or 0
            history += f"# answer: {answer}\n"

    async def worker() -> None:
        while queue:
            await one(queue.pop(0))

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(streams)))
    return time.perf_counter() - t0, counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=16, help="sessions per stream count")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=4, help="distinct tasks the sessions draw")
    ap.add_argument("--heldout", type=int, default=16, help="held-out prompts (one turn each)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--streams", default="1,16")
    ap.add_argument("--json", type=Path, default=Path("reports/agentic.json"))
    args = ap.parse_args(argv)
    tokenizer = load_tokenizer(str(DEFAULT_TARGET))
    workloads = {"agentic": sessions(args.sessions, args.turns, args.tasks),
                 "held-out": [[p] for p in load_prompts(DEFAULT_PROMPTS, args.heldout)]}
    rows = []
    with Server(env={"SPECDEC_SUFFIX_TENANTS": "separate"}) as server:
        url = server.grpc_url
        asyncio.run(run_sessions(url, tokenizer, workloads["held-out"][:2], 1,
                                 GenerationParams(max_tokens=8, temperature=0.0), "warm-up"))
        for workload, work in workloads.items():
            for streams in (int(s) for s in args.streams.split(",")):
                for name, proposer, k in SETTINGS:
                    tenant = f"{workload}-{streams}-{name}"
                    params = GenerationParams(max_tokens=args.max_tokens, temperature=0.0,
                                              num_draft_tokens=k, proposer=proposer)
                    s, c = asyncio.run(run_sessions(url, tokenizer, work, streams, params,
                                                    tenant))
                    rows.append({"workload": workload, "streams": streams, "setting": name,
                                 "seconds": s, **c,
                                 "tokens_per_s": c[names.NUM_OUTPUT_TOKENS] / s})
                    print(f"{workload:<9} {streams:>2} streams  {name:<17} "
                          f"{rows[-1]['tokens_per_s']:7.1f} tok/s", flush=True)
        tree = server.by_label("specdec_suffix_tree", "part")
    print(f"\nsuffix decoding's trees at the end: {tree.get('tokens', 0):.0f} tokens, "
          f"{tree.get('nodes', 0):.0f} nodes\n")
    print("| workload | streams | setting | tok/s | vs target-only | accepted / drafted |")
    print("|---|---:|---|---:|---:|---|")
    for r in rows:
        base = next(b for b in rows if (b["workload"], b["streams"], b["setting"]) ==
                    (r["workload"], r["streams"], "target-only"))
        drafted = r[names.TOTAL_DRAFT_TOKENS]
        print(f"| {r['workload']} | {r['streams']} | {r['setting']} | {r['tokens_per_s']:.1f} | "
              f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x | "
              f"{r[names.TOTAL_ACCEPTED_DRAFT_TOKENS]} / {drafted} |")
    write_result(args.json, tree=tree, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
