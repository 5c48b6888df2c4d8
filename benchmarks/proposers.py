"""Which proposer pays where: target-only, the draft model, n-gram lookup and hybrid (lookup when
it has a match, else the draft model) with a fixed K on the repeating and free workloads
(workloads.py), in this process with the project's engine and loop, no Triton. With --medusa,
also Medusa-1 heads (specdec/proposers/medusa/) drafting inside the target's verification, as
target_model serves them; --proposers picks the settings.

Every setting runs the same prompts for the same max_tokens at temperature 0 with 1 or more
concurrent streams (specdec.decoding.local batches concurrent calls as Triton's dynamic batcher
would). Settings alternate within each repeat, so a load change on the machine touches all of them.
Per row: output tokens per second of wall time and per second of this process's CPU time (less
disturbed than wall time when other jobs share the machine; with --threads 1 it is close to what a
quiet core gives), each against target-only (same workload and streams), acceptance, tokens per
round, tokens proposed per round, the proposer's time per round (as the loop waits for it),
acceptance by draft position (accepted / drafted at 1..K) and whether every output equals
target-only's.

    .venv/bin/python benchmarks/proposers.py    # 16 prompts each, 64 tokens, K 4,8, 1 and 4 streams
    .venv/bin/python benchmarks/proposers.py --prompts 4 --streams 1 --repeats 1    # a quick look
    .venv/bin/python benchmarks/proposers.py --medusa HEADS --proposers medusa --workloads free
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from pathlib import Path

import torch

from inputs import add_pair_arguments, load_prompts, load_tokenizer
from machine import git_state, load_snapshot, machine
from progress import log
from workloads import WORKLOADS

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.decoding.local import LocalDrafter, LocalVerifier
from specdec.decoding.loop import speculate
from specdec.proposers.medusa.checkpoint import load_medusa
from specdec.proposers.medusa.drafting import MedusaDrafter
from specdec.proposers.ngram import MAX_N, MIN_N, NgramProposer
from specdec.records import Proposer, Request


PROPOSERS = {"draft": "draft", "ngram": "n-gram", "hybrid": "hybrid", "medusa": "Medusa"}


def settings(ks: list[int], proposers: list[str]) -> list[tuple[str, str, int]]:
    """(label, proposer, k): target-only first, the baseline of every speedup."""
    return [("target-only", "draft", 0)] + [(f"{PROPOSERS[p]} K={k}", p, k)
                                            for p in proposers for k in ks]


def run(prompts: list[list[int]], k: int, proposer: str, drafter, ngram, verifier, streams: int,
        max_tokens: int, max_len: int, eos: tuple[int, ...], seq, in_target: tuple = (),
        on_round=None) -> tuple[list[list[int]], list, float, float]:
    """All prompts through `streams` concurrent sequences: (outputs, stats, wall s, CPU s)."""
    outputs: list[list[int]] = [[] for _ in prompts]
    stats: list = [None] * len(prompts)
    todo = iter(range(len(prompts)))

    async def worker():
        for i in todo:
            req = Request(prompts[i], max_tokens, k, eos=eos, proposer=proposer)
            stats[i] = await speculate(next(seq), req, drafter, verifier, max_len,
                                       lambda c, i=i: outputs[i].extend(c.tokens), ngram=ngram,
                                       in_target=in_target, on_round=on_round)

    async def all_streams():
        await asyncio.gather(*(worker() for _ in range(streams)))

    t0, c0 = time.perf_counter(), time.process_time()
    asyncio.run(all_streams())
    return outputs, stats, time.perf_counter() - t0, time.process_time() - c0


def table(rows: list[dict]) -> str:
    out = ["| workload | streams | setting | tok/s | vs target-only | tok/CPU-s | vs target-only "
           "| acceptance | tokens/round | proposed/round | propose ms/round "
           "| acceptance by position | output = target-only |",
           "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        acc_s = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        by_pos = " / ".join(f"{a:.2f}" for a in r["acceptance_by_position"]) or "-"
        out.append(f"| {r['workload']} | {r['streams']} | {r['setting']} "
                   f"| {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x "
                   f"| {r['tokens_per_cpu_s']:.1f} | {r['speedup_cpu']:.2f}x "
                   f"| {acc_s} | {r['tokens_per_round']:.2f} | {r['proposed_per_round']:.2f} "
                   f"| {r['propose_ms_per_round']:.3f} | {by_pos} "
                   f"| {'yes' if r['equal_to_target_only'] else 'NO'} |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--workloads", default="repeating,free", help="of: " + ",".join(WORKLOADS))
    ap.add_argument("--prompts", type=int, default=16, help="per workload")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--ks", default="4,8")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--repeats", type=int, default=2, help="passes over all settings, alternating")
    ap.add_argument("--max-n", type=int, default=MAX_N)
    ap.add_argument("--min-n", type=int, default=MIN_N)
    ap.add_argument("--max-seq-len", type=int, default=512)
    ap.add_argument("--medusa", type=Path, help="Medusa-1 heads for the target (distill --method "
                    "medusa): adds the medusa settings")
    ap.add_argument("--proposers", help="of: " + ",".join(PROPOSERS) + " (default: "
                    "draft,ngram,hybrid, and medusa with --medusa)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads, 0 = torch's default")
    ap.add_argument("--out", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ks = [int(k) for k in args.ks.split(",")]
    proposers = (args.proposers.split(",") if args.proposers else
                 ["draft", "ngram", "hybrid"] + (["medusa"] if args.medusa else []))
    if "medusa" in proposers and not args.medusa:
        ap.error("--proposers medusa needs --medusa HEADS")
    stream_counts = [int(s) for s in args.streams.split(",")]
    tok = load_tokenizer(args.target)
    margs = ModelArgs.from_dir(args.target)
    cpu = torch.device("cpu")
    slots = max(stream_counts)
    target = Engine.load(str(args.target), slots, args.max_seq_len, torch.float32, cpu,
                         vocab_size=margs.vocab_size)
    draft = Engine.load(str(args.draft), slots, args.max_seq_len, torch.float32, cpu,
                        vocab_size=margs.vocab_size)
    in_target: tuple = ()
    if args.medusa:   # as target_model attaches them (serving/drafters.py)
        heads = load_medusa(args.medusa, margs, torch.float32, cpu)
        target.add_drafter(Proposer.MEDUSA, MedusaDrafter(heads, target.vocab_size))
        in_target = (Proposer.MEDUSA,)
    verifier, draft_model = LocalVerifier(target), LocalDrafter(draft)
    seq = itertools.count(1)
    rows = []
    for workload in args.workloads.split(","):
        prompts = [tok(p)["input_ids"] for p in load_prompts(WORKLOADS[workload], args.prompts)]
        for streams in stream_counts:
            acc = {label: dict(tokens=0, wall=0.0, cpu=0.0, drafted=0, accepted=0, rounds=0,
                               propose_s=0.0, same=True, at=[0] * k, ok_at=[0] * k)
                   for label, _, k in settings(ks, proposers)}
            reference = None
            for rep in range(args.repeats + 1):        # pass 0 warms up, untimed
                for label, proposer, k in settings(ks, proposers):
                    by_position = []   # (drafted, accepted) of each timed round
                    outs, stats, wall, cpu = run(
                        prompts[:2] if rep == 0 else prompts, k, proposer, draft_model,
                        NgramProposer(args.max_n, args.min_n), verifier, streams,
                        args.max_tokens, args.max_seq_len, margs.eos_token_ids, seq, in_target,
                        lambda r: by_position.append((r.k, r.accepted)))
                    if rep == 0:
                        continue
                    reference = reference or outs
                    a = acc[label]
                    a["same"] &= outs == reference
                    a["wall"] += wall
                    a["cpu"] += cpu
                    for drafted, accepted in by_position:
                        for j in range(min(drafted, k)):
                            a["at"][j] += 1
                            a["ok_at"][j] += j < accepted
                    for s in stats:
                        a["tokens"] += s.num_output_tokens
                        a["drafted"] += s.total_draft_tokens
                        a["accepted"] += s.total_accepted_draft_tokens
                        a["rounds"] += s.rounds
                        a["propose_s"] += s.draft_s
                    tokens = sum(s.num_output_tokens for s in stats)
                    log(f"{workload} x{streams} {label}: {tokens / wall:.1f} tok/s")
            base = acc["target-only"]
            for label, proposer, k in settings(ks, proposers):
                a = acc[label]
                rows.append({
                    "workload": workload, "streams": streams, "setting": label, "k": k,
                    "tokens_per_s": a["tokens"] / a["wall"],
                    "speedup": a["tokens"] / a["wall"] / (base["tokens"] / base["wall"]),
                    "tokens_per_cpu_s": a["tokens"] / a["cpu"],
                    "speedup_cpu": a["tokens"] / a["cpu"] / (base["tokens"] / base["cpu"]),
                    "acceptance": a["accepted"] / a["drafted"] if a["drafted"] else None,
                    "tokens_per_round": a["tokens"] / a["rounds"],
                    "proposed_per_round": a["drafted"] / a["rounds"],
                    "propose_ms_per_round": a["propose_s"] / a["rounds"] * 1e3,
                    "acceptance_by_position": [ok / n if n else 0.0
                                               for ok, n in zip(a["ok_at"], a["at"])],
                    "equal_to_target_only": a["same"]})
    print(f"{len(prompts)} prompts per workload, {args.max_tokens} tokens, greedy, "
          f"{args.repeats} timed passes, n-gram n {args.max_n}..{args.min_n}, "
          f"torch {torch.get_num_threads()} threads, load {load_snapshot()['loadavg_1_5_15']}\n")
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv, "machine": machine(), "git": git_state(),
                                        "load": load_snapshot(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
