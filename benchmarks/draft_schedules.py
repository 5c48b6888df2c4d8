"""Which draft length pays: fixed K, stopping on the draft's confidence, or an adaptive K.

Walks the target's own greedy continuation of each prompt. At every position the draft proposes
--max-k tokens greedily; the script records its confidence in each (its top probability) and
whether the target's greedy token there is the same. Rounds are then replayed exactly for each
policy: tokens per round and drafted tokens per round are measured, not modelled. A round's
time is modelled as fixed + draft_ms x drafted + verify_ms x drafted (defaults: the
single-stream server of docs/benchmarks.md, run f), and speed is given relative to fixed K=8.

    .venv/bin/python benchmarks/draft_schedules.py                  # 32 prompts, 64 tokens
    .venv/bin/python benchmarks/draft_schedules.py --fixed-ms 5.2 --draft-ms 0.8 --verify-ms 0.25

Policies: fixed K; "confidence t" = K up to 16, stop after a draft token whose probability is
below t (transformers' assistant_confidence_threshold); "adaptive +u/-d" = start at 8, K += u
after a round that accepted everything, K -= d otherwise (transformers' "heuristic" schedule is
+2/-1), within 1..16.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from inputs import DEFAULT_PROMPTS, add_pair_arguments, prompt_ids

from specdec.runtime.engine import Engine
from specdec.records import ProposeCall, VerifyCall
from specdec.runtime.sampling import SamplingParams


def record(target: Engine, draft: Engine, prompt: list[int], n: int, max_k: int):
    """Per generated position: (draft confidences [max_k], matches [max_k])."""
    greedy = SamplingParams()
    out = target.verify([VerifyCall(0, 0, prompt, [], None, greedy)])[0].tokens
    while len(out) < n + max_k:
        start = len(prompt) + len(out) - 1
        out += target.verify([VerifyCall(0, start, [out[-1]], [], None, greedy)])[0].tokens
    target.release([0])
    seq = prompt + out
    confidences: list[float] = []
    logits = draft._logits
    draft._logits = lambda h: _noting(logits(h), confidences)
    rows = []
    for i in range(len(prompt), len(prompt) + n):
        confidences.clear()
        start = 0 if i == len(prompt) else i - 1
        tokens = draft.propose([ProposeCall(0, start, seq[start:i], max_k, greedy)])[0].tokens
        rows.append((list(confidences), [int(a == b) for a, b in zip(tokens, seq[i:i + max_k])]))
    draft._logits = logits
    draft.release([0])
    return rows


def _noting(logits: torch.Tensor, into: list[float]) -> torch.Tensor:
    into.append(logits.softmax(-1).amax(-1).reshape(-1)[0].item())
    return logits


def replay(paths, n: int, choose_k, after_round):
    """Returns (tokens, rounds, drafted). choose_k(state, confidences) -> drafted this round."""
    tokens = rounds = drafted = 0
    for rows in paths:
        i, state = 0, {"k": 8}
        while i < n:
            conf, match = rows[i]
            k = choose_k(state, conf)
            accepted = 0
            while accepted < k and match[accepted]:
                accepted += 1
            after_round(state, accepted, k)
            i += accepted + 1
            tokens += accepted + 1
            rounds += 1
            drafted += k
    return tokens, rounds, drafted


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_pair_arguments(ap)
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--max-k", type=int, default=16)
    ap.add_argument("--fixed-ms", type=float, default=12.3)
    ap.add_argument("--draft-ms", type=float, default=0.9)
    ap.add_argument("--verify-ms", type=float, default=0.38)
    args = ap.parse_args(argv)
    prompts = prompt_ids(args.target, args.prompts_file, args.prompts)
    cpu = torch.device("cpu")
    max_len = max(map(len, prompts)) + args.tokens + 2 * args.max_k + 2
    target = Engine.load(str(args.target), 1, max_len, torch.float32, cpu)
    draft = Engine.load(str(args.draft), 1, max_len, torch.float32, cpu,
                        vocab_size=target.vocab_size)
    paths = []
    for j, p in enumerate(prompts):
        paths.append(record(target, draft, p, args.tokens, args.max_k))
        print(f"recorded {j + 1}/{len(prompts)}", file=sys.stderr)

    def fixed(k):
        return (lambda s, c: k), (lambda s, a, k_: None)

    def confidence(t):
        def choose(s, conf):
            return next((j + 1 for j, c in enumerate(conf) if c < t), args.max_k)
        return choose, (lambda s, a, k_: None)

    def adaptive(up, down):
        def after(s, accepted, k):
            s["k"] = min(args.max_k, k + up) if accepted == k else max(1, k - down)
        return (lambda s, c: s["k"]), after

    policies = [(f"fixed K={k}", fixed(k)) for k in (4, 6, 8, 10, 12, 16)]
    policies += [(f"confidence {t}", confidence(t)) for t in (0.2, 0.4, 0.6)]
    policies += [(f"adaptive +{u}/-{d}", adaptive(u, d)) for u, d in ((2, 1), (1, 1), (4, 1))]
    results = {}
    for name, (choose, after) in policies:
        tokens, rounds, drafted = replay(paths, args.tokens, choose, after)
        ms = rounds * args.fixed_ms + drafted * (args.draft_ms + args.verify_ms)
        results[name] = (tokens / rounds, drafted / rounds, tokens / ms * 1e3)
    base = results["fixed K=8"][2]
    print(f"{len(prompts)} prompts x {args.tokens} tokens; round = {args.fixed_ms} ms + "
          f"({args.draft_ms} + {args.verify_ms}) ms per drafted token\n")
    print("| policy | tokens/round | drafted/round | modelled tok/s | vs fixed K=8 |")
    print("|---|---:|---:|---:|---:|")
    for name, (per_round, drafted, speed) in results.items():
        print(f"| {name} | {per_round:.2f} | {drafted:.2f} | {speed:.0f} | {speed / base:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
