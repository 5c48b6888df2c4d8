"""A parallel draft (PARD) against the autoregressive draft it was made from, on the default
pair: the draft's time a round against K (in process, one sequence), acceptance by position on
the held-out prompts (greedy, the engine's proposals at every position), and served tok/s at
each draft's best K against target-only (one stream, greedy, a tritonserver per draft).

--make DIR converts the default draft first, as a user would (`specdec distill --method pard
--from-draft`), on the corpus the default pair was trained on (the stdlib's training files).

    .venv/bin/python benchmarks/pard.py --make /tmp/pard     # about 15 minutes on 2 CPU cores
    .venv/bin/python benchmarks/pard.py --pard DIR           # a PARD draft made already
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from clients import run_requests
from inputs import (DEFAULT_DRAFT, DEFAULT_PROMPTS, DEFAULT_TARGET, ROOT, load_prompts,
                    load_tokenizer)
from machine import write_result
from progress import log
from server import Server

from specdec import cli
from specdec.distill import measure
from specdec.runtime.engine import Engine
from specdec.records import ProposeCall
from specdec.runtime.sampling import SamplingParams

GREEDY = SamplingParams()
KS = (1, 2, 3, 4, 6, 8)


def make(out: Path, steps: int) -> None:
    """The default draft converted on the stdlib training files (scripts/make_default_models)."""
    spec = importlib.util.spec_from_file_location(
        "make_default_models", ROOT / "scripts" / "make_default_models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    train_files, _ = models.load_stdlib()
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "train.jsonl"
        corpus.write_text("".join(json.dumps({"text": t}) + "\n" for _, t in train_files))
        code = cli.main(["distill", "--method", "pard", "--target", str(DEFAULT_TARGET),
                         "--from-draft", str(DEFAULT_DRAFT), "--out", str(out), "--overwrite",
                         "--corpus", str(corpus), "--heldout", str(DEFAULT_PROMPTS),
                         "--steps", str(steps), "--batch", "8", "--seq-len", "128",
                         "--gen-sequences", "512", "--gen-tokens", "64", "--eval-prompts",
                         "16", "--max-k", "8", "--device", "cpu"])
    if code:
        raise SystemExit(f"specdec distill --method pard failed ({code})")


def draft_ms(drafts: dict[str, Engine], prompt: list[int], k: int, repeats: int) -> dict:
    """Each draft's median milliseconds for one round's proposal of k tokens after one new
    committed token, the drafts' calls alternating (a load change touches both)."""
    n = len(prompt)
    times: dict[str, list[float]] = {name: [] for name in drafts}
    for d in drafts.values():
        d.propose([ProposeCall(0, 0, prompt, k, GREEDY)])
    for r in range(repeats + 3):   # the first three warm up
        for name, d in drafts.items():
            t0 = time.perf_counter()
            d.propose([ProposeCall(0, n - 1, prompt[-1:], k, GREEDY)])
            if r >= 3:
                times[name].append(time.perf_counter() - t0)
    for d in drafts.values():
        d.release([0])
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def served(draft: Path, prompts: list[str], ks: tuple[int, ...], max_tokens: int,
           repeats: int) -> dict:
    """Median tok/s per num_draft_tokens (0: target-only; -1: auto), one stream, greedy; the
    settings alternate within each repeat."""
    out: dict[int, list[float]] = {k: [] for k in ks}
    with Server(draft=draft, max_sequences=4) as server:
        run_requests(server.grpc_url, list(enumerate(prompts[:2])), 0, 8, 1, "warm-up",
                     progress=False)
        for r in range(repeats):
            for k in ks:
                reqs, wall = run_requests(server.grpc_url, list(enumerate(prompts)), k,
                                          max_tokens, 1, f"k={k}", progress=False,
                                          proposer="draft")
                out[k].append(sum(q.tokens for q in reqs) / wall)
                log(f"{draft.name}: repeat {r + 1}, k={k}: {out[k][-1]:.1f} tok/s")
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--pard", type=Path, help="a PARD draft of the default target")
    which.add_argument("--make", type=Path, help="make one here first (kept if it exists)")
    ap.add_argument("--steps", type=int, default=600, help="--make's training steps (600)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64, help="target tokens per prompt (64)")
    ap.add_argument("--repeats", type=int, default=30, help="timed proposals per K (30)")
    ap.add_argument("--serve-repeats", type=int, default=3, help="served runs per K (3)")
    ap.add_argument("--json", type=Path, default=Path("reports/pard.json"))
    args = ap.parse_args(argv)
    pard = args.pard or args.make
    if args.make and not (args.make / "config.json").is_file():
        make(args.make, args.steps)
    torch.set_num_threads(2)
    texts = load_prompts(DEFAULT_PROMPTS, args.prompts)
    tok = load_tokenizer(DEFAULT_TARGET)
    ids = [tok(p)["input_ids"] for p in texts]
    max_len = max(map(len, ids)) + args.tokens + max(KS) + 1
    target, ar = measure.load_pair(DEFAULT_TARGET, DEFAULT_DRAFT, len(ids), max_len,
                                   torch.device("cpu"))
    _, par = measure.load_pair(DEFAULT_TARGET, pard, len(ids), max_len, torch.device("cpu"))
    assert par.parallel is not None and ar.parallel is None, "--pard: not a PARD checkpoint"

    by_k = {k: draft_ms({"ar": ar, "pard": par}, ids[0], k, args.repeats) for k in KS}
    costs = {name: {k: by_k[k][name] for k in KS} for name in ("ar", "pard")}
    conts = measure.continuations(target, ids, args.tokens)
    acc = {name: measure.acceptance(measure.match_runs(d, ids, conts, max(KS)), max(KS))
           for name, d in (("ar", ar), ("pard", par))}
    del target, ar, par
    speed = {"ar": served(DEFAULT_DRAFT, texts, (0, *KS, -1), args.tokens, args.serve_repeats),
             "pard": served(pard, texts, (0, *KS, -1), args.tokens, args.serve_repeats)}
    base = statistics.mean([speed["ar"][0], speed["pard"][0]])

    print("\nK | AR draft ms a round | PARD ms a round")
    print("\n".join(f"{k} | {costs['ar'][k]:.2f} | {costs['pard'][k]:.2f}" for k in KS))
    print("\nacceptance by position (K=8), accepted / drafted at each position:")
    for name in ("ar", "pard"):
        print(f"  {name:<4} " + " ".join(f"{a:.2f}" for a in acc[name]["acceptance_by_position"]))
    print("\nserved, one stream, greedy, medians: tok/s (vs target-only's, both servers' mean, "
          f"{base:.1f})")
    for name in ("ar", "pard"):
        row = speed[name]
        best = max(KS, key=row.get)
        print(f"  {name:<4} best K={best}: {row[best]:.1f} ({row[best] / base:.2f}x); "
              f"auto: {row[-1]:.1f} ({row[-1] / base:.2f}x)")
    write_result(args.json, pard=str(pard), draft_ms=costs, acceptance=acc, tokens_per_s=speed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
