"""Held-out acceptance by position, the draft/target cost ratio c and the predicted speedup,
measured with specdec's engine: what the server runs.

At temperature 0 a draft's proposal depends only on the committed prefix, and greedy output is
the target's greedy continuation whatever K is. So the draft proposes max_k tokens at every
position of the target's continuation once (engine.propose, batched over prompts), and the
rounds of specdec's loop are then replayed exactly for every K <= max_k: the same rounds,
drafted and accepted tokens as `loop.speculate` at that K (tests/core/test_distill_measure.py).
The speedup is predicted with Leviathan et al. 2023's cost model, one target pass per round plus
c per drafted token, on the measured rounds: S = tokens / (rounds + c * drafted); for a parallel
draft (PARD), whose one pass drafts every token, c per drafting round instead.

    python -m specdec.distill.measure --target DIR --draft DIR --prompts FILE [--tokens 64]
    python -m specdec.distill.measure --target DIR --head DIR --prompts FILE   # an EAGLE-3 head
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from ..runtime.engine import Engine, default_dtype
from ..proposers.eagle.checkpoint import HeadCheckpoint
from ..records import ProposeCall, Proposer, VerifyCall
from ..runtime.sampling import SamplingParams
from .data import generate

EAGLE = Proposer.EAGLE

GREEDY = SamplingParams()


def continuations(target: Engine, prompts: list[list[int]], n: int) -> list[list[int]]:
    """The target's greedy continuation of each prompt, n tokens (not stopped at eos)."""
    return generate(target, prompts, n, [GREEDY] * len(prompts))


def match_runs(draft: Engine, prompts: list[list[int]], conts: list[list[int]],
               max_k: int) -> list[list[int]]:
    """runs[p][i]: how many of the draft's max_k greedy tokens after prompt p + conts[p][:i]
    equal conts[p][i:], for i in 1..n-1 (runs[p][0] is unused: the first token is the
    target's prefill alone). One batched propose per position, all prompts at once."""
    n = len(conts[0])
    runs = [[0] * n for _ in prompts]
    for i in range(1, n):
        calls = [ProposeCall(p, 0, prompt + c[:1], max_k, GREEDY) if i == 1 else
                 ProposeCall(p, len(prompt) + i - 1, [c[i - 1]], max_k, GREEDY)
                 for p, (prompt, c) in enumerate(zip(prompts, conts))]
        for p, proposal in enumerate(draft.propose(calls)):
            if isinstance(proposal, Exception):
                raise proposal
            ahead = conts[p][i:i + max_k]
            runs[p][i] = next((j for j, (a, b) in enumerate(zip(proposal.tokens, ahead))
                               if a != b), len(ahead))
    draft.release(list(range(len(prompts))))
    return runs


def head_runs(engine: Engine, prompts: list[list[int]], conts: list[list[int]],
              max_k: int) -> list[list[int]]:
    """match_runs for an EAGLE-3 head served by `engine` (Engine.load(...,
    head=HeadCheckpoint(...))): the head drafts inside the target's verification, so the committed
    tokens go through verify one at a time (all prompts batched), each call asking the head for
    max_k tokens after the target's own next token, as the served loop's next_k does. At temperature
    0 the head's proposal is a function of the committed prefix alone, so these are the loop's
    proposals at every K."""
    n = len(conts[0])
    runs = [[0] * n for _ in prompts]
    for i in range(1, n):
        calls = [VerifyCall(p, 0, prompt, [], None, GREEDY, max_k, next_by=EAGLE) if i == 1 else
                 VerifyCall(p, len(prompt) + i - 2, [c[i - 2]], [], None, GREEDY, max_k,
                            next_by=EAGLE)
                 for p, (prompt, c) in enumerate(zip(prompts, conts))]
        for p, verdict in enumerate(engine.verify(calls)):
            if isinstance(verdict, Exception):
                raise verdict
            if verdict.tokens != [conts[p][i - 1]] or verdict.failure:
                raise RuntimeError(f"prompt {p}, token {i - 1}: the target's verification "
                                   f"{verdict.tokens} ({verdict.failure or 'no failure'}) is "
                                   f"not its greedy continuation's {conts[p][i - 1]}")
            ahead = conts[p][i:i + max_k]
            runs[p][i] = next((j for j, (a, b) in enumerate(zip(verdict.proposal or [], ahead))
                               if a != b), min(len(ahead), len(verdict.proposal or [])))
    engine.release(list(range(len(prompts))))
    return runs


def replay(runs: list[int], k: int) -> dict:
    """specdec.decoding.loop's rounds at K=k over one continuation of len(runs) tokens (max_tokens =
    its length): a first round of the target alone, then rounds drafting min(k, left - 1) tokens."""
    n, pos = len(runs), 1
    out = {"tokens": n, "rounds": 1, "drafted": 0, "accepted": 0, "drafting": 0,
           "drafted_at": [0] * k, "accepted_at": [0] * k}
    while pos < n:
        drafted = min(k, n - pos - 1)
        accepted = min(runs[pos], drafted)
        for j in range(drafted):
            out["drafted_at"][j] += 1
            out["accepted_at"][j] += j < accepted
        out["rounds"] += 1
        out["drafting"] += drafted > 0
        out["drafted"] += drafted
        out["accepted"] += accepted
        pos += accepted + 1
    return out


def acceptance(runs: list[list[int]], max_k: int) -> dict:
    """acceptance_by_position at K=max_k (accepted / drafted at each draft position, the
    server's specdec_*_at_position metrics) and, per K, a = accepted / drafted and the tokens
    per target pass, both as the server reports them."""
    per_k = {}
    for k in range(1, max_k + 1):
        rounds = [replay(r, k) for r in runs]
        per_k[k] = {key: [sum(col) for col in zip(*(r[key] for r in rounds))]
                    if isinstance(value, list) else sum(r[key] for r in rounds)
                    for key, value in rounds[0].items()}
    top = per_k[max_k]
    return {
        "acceptance_by_position": [round(a / d, 4) if d else None
                                   for a, d in zip(top["accepted_at"], top["drafted_at"])],
        "per_k": {k: {"a": round(t["accepted"] / max(t["drafted"], 1), 4),
                      "tokens_per_round": round(t["tokens"] / t["rounds"], 3),
                      "accepted_per_round": round(t["accepted"] / t["rounds"], 3),
                      "rounds": t["rounds"], "drafted": t["drafted"], "tokens": t["tokens"],
                      "drafting_rounds": t["drafting"]}
                  for k, t in per_k.items()},
    }


def cost_ratio(target: Engine, draft: Engine, prompt: list[int], k: int = 4,
               repeats: int = 20) -> float:
    """c: the draft's time per drafted token (a parallel draft's: per pass of k) over the
    target's time for one token, one sequence at a time (as the benchmark defines it), medians
    of alternating calls."""
    n = len(prompt)
    target.verify([VerifyCall(0, 0, prompt, [], None, GREEDY)])
    draft.propose([ProposeCall(0, 0, prompt, k, GREEDY)])
    t_times, d_times = [], []
    for r in range(repeats + 3):   # the first three warm up
        t0 = time.perf_counter()
        target.verify([VerifyCall(0, n - 1, prompt[-1:], [], None, GREEDY)])
        t1 = time.perf_counter()
        draft.propose([ProposeCall(0, n - 1, prompt[-1:], k, GREEDY)])
        t2 = time.perf_counter()
        if r >= 3:
            t_times.append(t1 - t0)
            d_times.append((t2 - t1) / (1 if draft.parallel else k))
    target.release([0])
    draft.release([0])
    return statistics.median(d_times) / statistics.median(t_times)


def head_cost_ratio(engine: Engine, prompt: list[int], k: int = 4, repeats: int = 20) -> float:
    """c for an EAGLE-3 head: the head's seconds per drafted token inside a verification
    (its catch-up included, Verdict.draft_s) over the target's time for one token, one sequence
    at a time, medians of alternating calls."""
    n = len(prompt)
    engine.verify([VerifyCall(0, 0, prompt, [], None, GREEDY, k, next_by=EAGLE)])
    t_times, d_times = [], []
    for r in range(repeats + 3):   # the first three warm up
        t0 = time.perf_counter()
        engine.verify([VerifyCall(0, n - 1, prompt[-1:], [], None, GREEDY)])
        t1 = time.perf_counter()
        verdict = engine.verify([VerifyCall(0, n - 1, prompt[-1:], [], None, GREEDY, k,
                                            next_by=EAGLE)])[0]
        if r >= 3:
            t_times.append(t1 - t0)
            d_times.append(verdict.draft_s / k)
    engine.release([0])
    return statistics.median(d_times) / statistics.median(t_times)


def predict(acc: dict, c: float, per_pass: bool = False) -> dict:
    """Per K the predicted speedup over the target alone; the best K; K=4. per_pass: c is a
    parallel draft's, per drafting round."""
    for row in acc["per_k"].values():
        drafted = row["drafting_rounds"] if per_pass else row["drafted"]
        row["predicted_speedup"] = round(row["tokens"] / (row["rounds"] + c * drafted), 3)
    best = max(acc["per_k"], key=lambda k: acc["per_k"][k]["predicted_speedup"])
    return {**acc, "c": round(c, 4), "c_per": "pass" if per_pass else "token", "best_k": best}


def measure(target: Engine, draft: Engine, prompts: list[list[int]], conts: list[list[int]],
            max_k: int, timed: bool) -> dict:
    acc = acceptance(match_runs(draft, prompts, conts, max_k), max_k)
    if not timed:
        return acc
    return predict(acc, cost_ratio(target, draft, prompts[0]), draft.parallel is not None)


def load_pair(target: Path, draft: Path, slots: int, max_len: int, device: torch.device
              ) -> tuple[Engine, Engine]:
    """Both engines as the server loads them: bfloat16 on CUDA, float32 on the CPU."""
    dtype = default_dtype(device)
    t = Engine.load(str(target), slots, max_len, dtype, device, cuda_graphs=False)
    d = Engine.load(str(draft), slots, max_len, dtype, device, vocab_size=t.vocab_size,
                    cuda_graphs=False)
    return t, d


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Held-out acceptance by position, c and the "
                                             "predicted speedup of a draft (or an EAGLE-3 "
                                             "head) for a target.")
    ap.add_argument("--target", type=Path, required=True)
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--draft", type=Path, help="a draft model's directory")
    which.add_argument("--head", type=Path, help="an EAGLE-3 head's directory (either format)")
    ap.add_argument("--prompts", type=Path, required=True, help="JSON lines or one per line")
    ap.add_argument("--tokens", type=int, default=64, help="target tokens per prompt")
    ap.add_argument("--max-k", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from ..prompts import load_prompts
    from .data import encode_prompts
    tokenizer = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    prompts = encode_prompts(tokenizer, load_prompts(args.prompts), chat=False)
    max_len = max(map(len, prompts)) + args.tokens + args.max_k + 1
    device = torch.device(args.device)
    if args.head:
        target = Engine.load(str(args.target), len(prompts), max_len, default_dtype(device),
                             device, cuda_graphs=False, head=HeadCheckpoint(str(args.head)))
        conts = continuations(target, prompts, args.tokens)
        acc = acceptance(head_runs(target, prompts, conts, args.max_k), args.max_k)
        result = predict(acc, head_cost_ratio(target, prompts[0]))
    else:
        target, draft = load_pair(args.target, args.draft, len(prompts), max_len, device)
        result = measure(target, draft, prompts, continuations(target, prompts, args.tokens),
                         args.max_k, timed=True)
    json.dump(result, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
