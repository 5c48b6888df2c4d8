"""Speculative greedy output against target-only output in one dtype, with and without the
batch-invariant arithmetic (specdec/kernels/invariant.py), and what the invariance costs.

In process (the project's engine and loop, no Triton), on the default pair and its EAGLE-3 head
unless told otherwise. Per mode (off, on): the target-only reference (all prompts batched), then
the draft model at each K and at auto, prompt lookup, the head and hybrid, all prompts batched;
with --in-target also the drafters served in target_model's process (the draft model co-located,
SWIFT with --self-skip, Medusa heads with --medusa) on a second target engine; for each, the
prompts whose output differs from that mode's own reference and the first differing token, the
drafts accepted, and output tokens per second. One line per run, a JSON summary at the end.

    .venv/bin/python benchmarks/exactness.py                     # bf16, 16 prompts x 128 tokens
    .venv/bin/python benchmarks/exactness.py --dtype float32 --ks 4
    .venv/bin/python benchmarks/exactness.py --in-target --medusa reports/medusa-short
    python3 benchmarks/exactness.py --device cuda --target /tmp/rp/target --draft /tmp/rp/draft \
        --head /tmp/rp/eagle --ks 4 --max-tokens 64     # make_random_pair.py --head --out /tmp/rp
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

import torch

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.checkpoint import HeadCheckpoint
from specdec.decoding.local import LocalDrafter, LocalVerifier
from specdec.decoding.loop import open_policy, speculate
from specdec.proposers.ngram import NgramProposer
from specdec.planning.planner import Planner
from specdec.records import IN_TARGET, Proposer, Request
from specdec.serving.drafters import attach
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import InTargetSettings

ROOT = Path(__file__).resolve().parents[1]

DEFAULT = ROOT / "models" / "default"


def prompts(n: int) -> list[list[int]]:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(DEFAULT / "target")
    lines = (DEFAULT / "heldout_prompts.jsonl").read_text().splitlines()[:n]
    return [tok(json.loads(line)["prompt"])["input_ids"] for line in lines]


def run(target: Engine, draft: Engine | None, reqs: list[Request],
        in_target: tuple[Proposer, ...]) -> tuple[list[list[int]], tuple[int, int]]:
    """Each request's output, and the tokens drafted and accepted over all of them."""
    drafter = LocalDrafter(draft) if draft else None
    # A draft model in the target's process drafts a round ahead, as the head does.
    verifier, ngram = LocalVerifier(target), NgramProposer()
    planner = Planner(8, in_target=IN_TARGET + in_target)

    async def one(i, req):
        out, policy = [], open_policy(planner, req)
        try:
            stats = await speculate(1000 + i, req, drafter, verifier, target.max_len,
                                    lambda c: out.extend(c.tokens), policy=policy, ngram=ngram,
                                    in_target=in_target)
        finally:
            planner.close(policy)
        return out, stats

    async def all_():
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs)))
    done = asyncio.run(all_())
    return [o for o, _ in done], (sum(s.total_draft_tokens for _, s in done),
                                  sum(s.total_accepted_draft_tokens for _, s in done))


def transformers_greedy(ps: list[list[int]], max_tokens: int, dtype,
                        target: Path = DEFAULT / "target") -> list[list[int]]:
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=dtype)
    out = []
    for p in ps:
        ids = model.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                             eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(p):].tolist())
    return out


def first_differences(out: list[list[int]], ref: list[list[int]]) -> list[int]:
    return sorted(next(j for j, (x, y) in enumerate(zip(o + [-1], r + [-1])) if x != y)
                  for o, r in zip(out, ref) if o != r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3,4,5,6,7,8,auto")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cost-repeats", type=int, default=3,
                    help="then time target-only and --cost-k off and on, alternating, this often")
    ap.add_argument("--cost-k", default="2")
    ap.add_argument("--cost-only", action="store_true", help="skip the output comparison")
    ap.add_argument("--transformers", action="store_true",
                    help="also compare target-only with transformers' greedy generate, same dtype")
    ap.add_argument("--in-target", action="store_true",
                    help="also the draft model co-located, SWIFT and Medusa (with --medusa)")
    ap.add_argument("--self-skip", default="2,4", help="SWIFT's skipped layers")
    ap.add_argument("--medusa", type=Path, help="Medusa-1 heads for the default target")
    ap.add_argument("--target", type=Path, default=DEFAULT / "target",
                    help="a checkpoint with the default pair's tokenizer (make_random_pair.py)")
    ap.add_argument("--draft", type=Path, default=DEFAULT / "draft")
    ap.add_argument("--head", default=str(DEFAULT / "eagle"), help="'none': no head runs")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dtype, device = getattr(torch, a.dtype), torch.device(a.device)
    ps = prompts(a.prompts)
    max_len = max(map(len, ps)) + a.max_tokens + 16
    head = None if a.head == "none" else a.head
    vocab = ModelArgs.from_dir(a.target).vocab_size
    draft = Engine.load(str(a.draft), len(ps), max_len, dtype, device, vocab_size=vocab)
    targets = {mode: Engine.load(str(a.target), len(ps), max_len, dtype, device,
                                 head=head and HeadCheckpoint(head), batch_invariant=mode == "on")
               for mode in ("off", "on")}
    # The drafters target_model serves in its process, on a second engine of the same target
    # (their catch-up follows every verification, which the costs below must not pay).
    hosts = {mode: in_target_engine(a, len(ps), max_len, dtype, device, mode == "on")
             for mode in (("off", "on") if a.in_target else ())}

    def timed(mode: str, proposer: str, k: str) -> tuple[list[list[int]], float, tuple]:
        """Outputs, tokens/s, and (drafted, accepted) tokens of one run."""
        auto = k == "auto"
        kind = Proposer.DRAFT if proposer == "colocated" else Proposer(proposer)
        reqs = [Request(p, a.max_tokens, 8 if auto else int(k), proposer=kind, auto=auto)
                for p in ps]
        t0 = time.perf_counter()
        if proposer in ("colocated", "self", "medusa"):
            out, drafted = run(hosts[mode], None, reqs, (kind,))
        else:
            eagle = (Proposer.EAGLE,) if head and proposer in ("eagle", "hybrid") else ()
            out, drafted = run(targets[mode],
                               draft if proposer in ("draft", "hybrid") else None, reqs, eagle)
        return out, sum(map(len, out)) / (time.perf_counter() - t0), drafted

    summary = []
    runs = [("draft", k) for k in a.ks.split(",")] + [("ngram", "8")] + (
        [("eagle", "4")] if head else []) + [("hybrid", "auto")]
    if a.in_target:
        runs += [("colocated", "4"), ("self", "2"), ("self", "auto")]
        runs += [("medusa", "2"), ("medusa", "auto")] if a.medusa else []
    for mode in () if a.cost_only else ("off", "on"):
        ref, _, _ = timed(mode, "ngram", "0")
        for proposer, k in runs:
            out, _, drafted = timed(mode, proposer, k)
            first = first_differences(out, ref)
            print(f"invariant {mode}: {proposer} k={k}: {len(first)} of {len(ps)} differ from "
                  f"target-only" + (f", first at tokens {first}" if first else "") +
                  f" ({drafted[1]} of {drafted[0]} drafts accepted)", flush=True)
            summary.append(dict(invariant=mode, proposer=proposer, k=k, differ=len(first),
                                first=first, drafted=drafted[0], accepted=drafted[1]))
        if a.transformers and mode == "on":
            first = first_differences(transformers_greedy(ps, a.max_tokens, dtype, a.target),
                                      ref)
            print(f"transformers {a.dtype} greedy against target-only: {len(first)} of "
                  f"{len(ps)} differ" + (f", first at tokens {first}" if first else ""),
                  flush=True)
            summary.append(dict(invariant=mode, proposer="transformers", differ=len(first),
                                first=first))
    costs: dict[tuple[str, str], list[float]] = {}
    for r in range(a.cost_repeats):
        for proposer, k in (("ngram", "0"), ("draft", a.cost_k)):
            for mode in ("off", "on"):
                costs.setdefault((mode, f"{proposer if k != '0' else 'target-only'} {k}"),
                                 []).append(timed(mode, proposer, k)[1])
    for (mode, what), tps in sorted(costs.items(), key=lambda x: (x[0][1], x[0][0])):
        med = sorted(tps)[len(tps) // 2]
        other = sorted(costs[("off", what)])[len(tps) // 2]
        print(f"cost: {what}, invariant {mode}: {med:.0f} tok/s (median of {len(tps)}), "
              f"{med / other:.2f}x invariant off", flush=True)
        summary.append(dict(invariant=mode, cost=what, tok_s=tps))
    if a.json:
        a.json.write_text(json.dumps(dict(args={k: str(v) for k, v in vars(a).items()},
                                          runs=summary), indent=1))


def in_target_engine(a, rows: int, max_len: int, dtype: torch.dtype, device: torch.device,
                     invariant: bool) -> Engine:
    """The target with the draft model co-located, SWIFT and Medusa heads attached by
    serving/drafters.attach, as target_model attaches them."""
    engine = Engine.load(str(a.target), rows, max_len, dtype, device,
                         batch_invariant=invariant)
    attach(engine, EngineSettings(max_sequences=rows, max_seq_len=max_len,
                                  cuda_graphs=device.type == "cuda"),
           InTargetSettings("target", a.self_skip, str(a.medusa or "")),
           {"draft_model_path": str(a.draft)}, device, dtype)
    return engine


if __name__ == "__main__":
    main()
