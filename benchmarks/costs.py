"""What each engine call costs at a pair's shape, in this process, on this device: the target's
one-token step, its verification of K drafts, the draft model's proposal of K tokens, and the
part of a verification that drafts the next round in the target's process: an EAGLE-3 head's
catch-up and K drafts, SWIFT's (the target less `--self-skip`), random Medusa-1 heads'
(`--medusa-heads`); at several batch sizes, with and without CUDA graphs (on CUDA); with
`--prefill`, one prompt's prefill alone at given lengths (the time to first token's compute;
the exact mode's kernels tile a prompt otherwise than cuBLAS and flash-attn). Then the
speedups those costs imply at given acceptance, marked as implied: with random weights
(benchmarks/make_random_pair.py) acceptance means nothing, the costs are real. In process: a
server round adds its BLS calls and the orchestrator.

    .venv/bin/python benchmarks/costs.py                       # the default pair and head, CPU
    python3 benchmarks/make_random_pair.py --out /tmp/rp --head  # Llama-3.1-8B/3.2-1B shapes
    python3 benchmarks/costs.py --pair /tmp/rp --batches 1,4,16 --json $OUT/costs.json

Every timed call is greedy on rows of `--context` cached tokens, rolled back to the same place
before each call, its drafts the target's own greedy continuation (all accepted: the head then
catches up K + 1 positions, its most; SWIFT's cache too). Ratios are to the one-token step at
the same batch: verify(K) = the verification's cost in steps; the draft model's proposal and an
in-target drafter's part of a verification (the verification that also drafts K, less the plain
one) as a least-squares line over K, in steps: fixed + per drafted token (the per-token part is
c).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from inputs import DEFAULT_DRAFT, DEFAULT_TARGET, ROOT
from machine import git_state, machine

from specdec.kernels import invariant_attention, invariant_gemm
from specdec.proposers.eagle.checkpoint import load_head
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.drafting import HeadDrafter
from specdec.proposers.medusa.config import MedusaArgs
from specdec.proposers.medusa.drafting import MedusaDrafter
from specdec.proposers.medusa.head import MedusaHead
from specdec.records import Proposer, ProposeCall, VerifyCall
from specdec.runtime.sampling import SamplingParams
from specdec.serving.drafters import attach
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import NO_DRAFT, InTargetSettings
from specdec.proposers.swift import parse_skip
from specdec.runtime.weights import load_model

GREEDY = SamplingParams()
DEFAULT_HEAD = ROOT / "models" / "default" / "eagle"
# The drafters timed inside a verification, by the key their figures carry (head_verify_ms...).
IN_TARGET = {"head": Proposer.EAGLE, "self": Proposer.SELF, "medusa": Proposer.MEDUSA}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x]


class Timer:
    def __init__(self, device: torch.device, warmup: int, calls: int):
        self.device, self.warmup, self.calls = device, warmup, calls

    def __call__(self, fn) -> float:
        """Median milliseconds of fn() after `warmup` calls, the device synchronized around
        each call."""
        for _ in range(self.warmup):
            fn()
        times = []
        for _ in range(self.calls):
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)


class Rows:
    """B sequences of `context` cached tokens, their next token and greedy continuation."""

    def __init__(self, engine: Engine, first_id: int, b: int, context: int, k_max: int,
                 vocab: int, seed: int, by: Proposer | None = None):
        """by: the in-target drafter that follows each verification (a head catches up)."""
        gen = torch.Generator().manual_seed(seed)
        self.ids = list(range(first_id, first_id + b))
        self.context, self.by = context, by
        nk = 1 if by else None
        prompts = [torch.randint(1, vocab, (context,), generator=gen).tolist() for _ in self.ids]
        out = engine.verify([VerifyCall(s, 0, p, [], None, GREEDY, next_k=nk, next_by=self.by)
                             for s, p in zip(self.ids, prompts)])
        self.next = [v.tokens[0] for v in out]
        conts = [[] for _ in self.ids]
        last = list(self.next)
        for j in range(k_max):    # one token at a time: the continuation the drafts will be
            out = engine.verify([VerifyCall(s, context + j, [t], [], None, GREEDY, next_k=nk,
                                            next_by=self.by)
                                 for s, t in zip(self.ids, last)])
            last = [v.tokens[0] for v in out]
            for c, t in zip(conts, last):
                c.append(t)
        self.conts = conts

    def verify(self, engine: Engine, k: int, next_k: int | None = None):
        return engine.verify([VerifyCall(s, self.context, [t], c[:k], None, GREEDY,
                                         next_k=next_k, next_by=self.by)
                              for s, t, c in zip(self.ids, self.next, self.conts)])


def target_costs(model, head, medusa, args, device: torch.device, graphs: bool,
                 invariant: bool, timer: Timer) -> dict:
    """Per batch size: the one-token step (ms), verify(K) in steps, and each in-target
    drafter's verification (a head, SWIFT, Medusa heads). The plain engine first: the head's
    engine makes the model capture. invariant: the batch-invariant arithmetic
    (specdec/kernels/invariant.py; served by default in bf16); it stays on the model once set."""
    max_len = args.context + 3 * max(args.ks) + 4

    def engine(rows=max(args.batches), length=max_len, **kw) -> Engine:
        return Engine(model, rows, length, device, cuda_graphs=graphs,
                      batch_invariant=invariant, **kw)
    out = _plain(engine(), args, timer)
    if args.prefill:   # an engine of its own: the others' max_len (graphs' keys) stays
        out[args.batches[0]]["prefill_ms"] = _prefill(engine(1, max(args.prefill) + 1), args,
                                                      timer)
    if head is not None:
        try:
            _in_target(engine(head=HeadDrafter(head)), "head", args.ks, args, timer, out)
        finally:
            model.capture = ()
    if args.self_skip:    # as target_model attaches it: its own pool of the kept layers
        e = engine()
        attach(e, EngineSettings(max_sequences=max(args.batches), max_seq_len=max_len,
                                 cuda_graphs=graphs),
               InTargetSettings("separate", args.self_skip), {"draft_model_path": NO_DRAFT},
               device, model.lm_head.weight.dtype)
        _in_target(e, "self", args.ks, args, timer, out)
    if medusa is not None:
        e = engine()
        e.add_drafter(Proposer.MEDUSA, MedusaDrafter(medusa, e.vocab_size))
        _in_target(e, "medusa", [k for k in args.ks if k <= medusa.args.num_heads], args, timer,
                   out)
    return out


def _plain(engine: Engine, args, timer: Timer) -> dict:
    out = {}
    for b in args.batches:
        rows = Rows(engine, 1, b, args.context, max(args.ks), args.vocab, args.seed + b, False)
        step = timer(lambda: rows.verify(engine, 0))
        verify = {k: timer(lambda k=k: rows.verify(engine, k)) for k in args.ks}
        out[b] = {"step_ms": step, "verify_ms": verify,
                  "verify_steps": {k: v / step for k, v in verify.items()}}
        engine.release(rows.ids)
    return out


def _prefill(engine: Engine, args, timer: Timer) -> dict[int, float]:
    """Ms of one prompt's prefill alone, per length, from position 0 each call."""
    gen = torch.Generator().manual_seed(args.seed)
    few, out = Timer(timer.device, 1, min(timer.calls, 5)), {}
    for n in args.prefill:
        prompt = torch.randint(1, args.vocab, (n,), generator=gen).tolist()
        out[n] = few(lambda: engine.verify([VerifyCall(0, 0, prompt, [], None, GREEDY)]))
        engine.release([0])
    return out


def _in_target(engine: Engine, who: str, ks: list[int], args, timer: Timer, out: dict) -> None:
    """The verification of K drafts that also drafts K for the next round, by drafter `who`."""
    k_max = max(args.ks)
    for b in args.batches:
        rows = Rows(engine, 1, b, args.context, k_max, args.vocab, args.seed + b, IN_TARGET[who])
        # All accepted, a head's most catch-up, unless a verification of K + 1 tokens scores
        # a near-tie otherwise than the one-token steps did (arithmetic not batch-invariant).
        out[b][f"{who}_accepted"] = min(r.num_accepted for r in rows.verify(engine, k_max))
        out[b][f"{who}_verify_ms"] = {k: timer(lambda k=k: rows.verify(engine, k, k)) for k in ks}
        engine.release(rows.ids)


def draft_costs(draft, args, device: torch.device, graphs: bool, timer: Timer) -> dict:
    """Per batch size: the proposal of K tokens (ms), rows rolled back to `context` each time."""
    b_max, k_max = max(args.batches), max(args.ks)
    engine = Engine(draft, b_max, args.context + 2 * k_max + 2, device, vocab_size=args.vocab,
                    cuda_graphs=graphs)
    gen = torch.Generator().manual_seed(args.seed)
    out = {}
    for b in args.batches:
        ids = list(range(1, b + 1))
        prompts = [torch.randint(1, args.vocab, (args.context,), generator=gen).tolist()
                   for _ in ids]
        engine.propose([ProposeCall(s, 0, p, 1, GREEDY) for s, p in zip(ids, prompts)])
        n = args.context

        def propose(k):
            return engine.propose([ProposeCall(s, n - 1, [p[-1]], k, GREEDY)
                                   for s, p in zip(ids, prompts)])
        out[b] = {"propose_ms": {k: timer(lambda k=k: propose(k)) for k in args.ks}}
        engine.release(ids)
    return out


def line(points: dict[int, float]) -> tuple[float, float]:
    """Least-squares (fixed, per K) of a cost against K."""
    ks, ys = list(points), list(points.values())
    if len(ks) < 2:
        return 0.0, ys[0] / ks[0]
    mk, my = statistics.fmean(ks), statistics.fmean(ys)
    slope = sum((k - mk) * (y - my) for k, y in zip(ks, ys)) / sum((k - mk) ** 2 for k in ks)
    return my - slope * mk, slope


def fits(row: dict) -> None:
    """In target steps: the draft model's proposal and the head's drafting as a fixed part (the
    call, the head's catch-up) plus a part per drafted token."""
    step = row["step_ms"]
    if "propose_ms" in row:
        f, per = line(row["propose_ms"])
        row["draft_fixed_steps"], row["draft_per_token_steps"] = f / step, per / step
    for who in IN_TARGET:
        if f"{who}_verify_ms" in row:
            extra = {k: ms - row["verify_ms"][k] for k, ms in row[f"{who}_verify_ms"].items()}
            f, per = line(extra)
            row[f"{who}_fixed_steps"], row[f"{who}_per_token_steps"] = f / step, per / step


def implied(row: dict, ks: list[int], acceptances: list[float], lengths: list[float]) -> dict:
    """Speedups over the target alone in process that the costs imply (not measured): the draft
    model, SWIFT and Medusa heads at acceptance a per token (the best K; tokens a round
    (1 - a^(K+1)) / (1 - a)); the head at L tokens a round (committed, bonus included), at
    each K."""
    out = {}
    step = row["step_ms"]
    rounds = {}    # a round's cost in steps at each K: verify and draft
    if "propose_ms" in row:
        rounds["draft"] = {k: row["verify_steps"][k] + row["propose_ms"][k] / step for k in ks}
    for who in ("self", "medusa"):
        if f"{who}_verify_ms" in row:
            rounds[who] = {k: ms / step for k, ms in row[f"{who}_verify_ms"].items()}
    for who, cost in rounds.items():
        best = {}
        for a in acceptances:
            s = {k: (1 - a ** (k + 1)) / (1 - a) / c for k, c in cost.items()}
            k = max(s, key=s.get)
            best[a] = {"k": k, "speedup": s[k]}
        out[who] = best
    if "head_verify_ms" in row:
        out["head"] = {length: {k: length / (row["head_verify_ms"][k] / row["step_ms"])
                                for k in ks} for length in lengths}
    return out


def table(results: dict, args) -> str:
    lines = []
    for key, per_b in results["runs"].items():
        lines.append(f"\n{key}")
        whos = ["draft"] + [w for w in IN_TARGET
                            if any(f"{w}_verify_ms" in r for r in per_b.values())]
        cols = ["batch", "step ms"] + [f"verify K={k}" for k in args.ks] + \
            [f"{who}: fixed + per token" for who in whos]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---:|" * len(cols))
        for b, r in per_b.items():
            cells = [str(b), f"{r['step_ms']:.3f}"]
            cells += [f"{r['verify_steps'][k]:.2f}" for k in args.ks]
            for who in whos:
                cells.append(f"{r[who + '_fixed_steps']:.3f} + {r[who + '_per_token_steps']:.3f}"
                             if who + "_fixed_steps" in r else "-")
            lines.append("| " + " | ".join(cells) + " |")
            for who in IN_TARGET:
                if r.get(f"{who}_accepted", max(args.ks)) < max(args.ks):
                    lines.append(f"(batch {b}: {who}'s catch-up after {r[who + '_accepted']} of "
                                 f"{max(args.ks)} accepted, not all)")
        lines.append("implied (not measured), in process:")
        for b, r in per_b.items():
            imp = r["implied"]
            parts = [f"{who} " + ", ".join(f"a={a}: {v['speedup']:.2f}x (K={v['k']})"
                                           for a, v in imp[who].items())
                     for who in ("draft", "self", "medusa") if who in imp]
            if "head" in imp:
                k = args.head_k if args.head_k in args.ks else args.ks[-1]
                parts.append(f"head K={k} " + ", ".join(
                    f"L={length}: {v[k]:.2f}x" for length, v in imp["head"].items()))
            lines.append(f"  batch {b}: " + "; ".join(parts))
        for r in per_b.values():
            if r.get("prefill_ms"):
                lines.append("prefill, one prompt alone: " + ", ".join(
                    f"{n} tokens {ms:.1f} ms" for n, ms in r["prefill_ms"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", type=Path,
                    help="a directory with target/, draft/ and optionally eagle/ "
                         "(make_random_pair.py --head); else --target, --draft, --head")
    ap.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--draft", type=Path, default=DEFAULT_DRAFT)
    ap.add_argument("--head", type=Path, default=DEFAULT_HEAD, help="'none': no head")
    ap.add_argument("--self-skip", default="", help="SWIFT: the target's layers to skip, e.g. "
                    "'2,4,6' or '8-23' (default: SWIFT not timed)")
    ap.add_argument("--medusa-heads", type=int, default=0,
                    help="random Medusa-1 heads (one residual block each) at the target's shape")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"),
                    default="auto", help="auto: bfloat16 on CUDA, float32 on the CPU")
    ap.add_argument("--batches", type=_ints, default=[1, 4, 16])
    ap.add_argument("--ks", type=_ints, default=list(range(1, 9)), help="drafts per round")
    ap.add_argument("--context", type=int, default=512, help="cached tokens per row")
    ap.add_argument("--prefill", type=_ints, default=[],
                    help="prompt lengths whose prefill to time, one prompt alone (the time to "
                         "first token's compute), e.g. 512,2048")
    ap.add_argument("--graphs", default="auto", choices=("auto", "on", "off", "both"),
                    help="CUDA graphs; auto: both on CUDA, off on the CPU")
    ap.add_argument("--invariant", default="auto", choices=("auto", "on", "off", "both"),
                    help="batch-invariant arithmetic; auto: both in bf16/fp16, off in float32")
    ap.add_argument("--invariant-kernels", default="auto", choices=("auto", "off", "both"),
                    help="the invariant runs on CUDA: auto: the Triton kernels (invariant_gemm, "
                         "invariant_attention) where their load probes pass, as served; off: "
                         "cuBLAS over fixed row blocks and padded attention calls; both")
    ap.add_argument("--calls", type=int, default=30, help="timed calls per figure (median)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, help="torch threads on the CPU")
    ap.add_argument("--acceptance", type=_floats, default=[0.6, 0.7, 0.8])
    ap.add_argument("--lengths", type=_floats, default=[2.5, 3.0, 3.5],
                    help="the head's tokens per round for its implied speedups")
    ap.add_argument("--head-k", type=int, default=4, help="the K the table's head line uses")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args(argv)
    if args.pair:
        args.target, args.draft = args.pair / "target", args.pair / "draft"
        args.head = args.pair / "eagle" if (args.pair / "eagle").is_dir() else Path("none")
    args.ks = sorted(set(args.ks))
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available()
                          else "cpu" if args.device == "auto" else args.device)
    dtype = {"auto": torch.bfloat16 if device.type == "cuda" else torch.float32,
             "float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[args.dtype]
    settings = {"auto": [False, True] if device.type == "cuda" else [False], "on": [True],
                "off": [False], "both": [False, True]}[args.graphs]
    t0 = time.perf_counter()
    model = load_model(str(args.target), dtype, device)
    args.vocab = model.args.vocab_size
    head = None if str(args.head) == "none" else load_head(args.head, model, dtype, device)
    draft = None if str(args.draft) == "none" else load_model(str(args.draft), dtype, device)
    try:
        if args.self_skip:    # refused here, before any timing
            parse_skip(args.self_skip, model.args.num_layers, "--self-skip")
    except ValueError as e:
        ap.error(str(e))
    medusa = None
    if args.medusa_heads:   # built on the device: 4 heads at 8B are 2.1 G parameters
        torch.manual_seed(args.seed)
        with device:
            medusa = MedusaHead(MedusaArgs(args.medusa_heads, 1, model.args.hidden_size,
                                           model.args.vocab_size)).to(dtype).eval()
    print(f"loaded in {time.perf_counter() - t0:.0f} s on {_device_name(device)}, {dtype}",
          file=sys.stderr, flush=True)
    timer = Timer(device, args.warmup, args.calls)
    results = {"device": _device_name(device), "dtype": str(dtype).removeprefix("torch."),
               "target": str(args.target), "draft": str(args.draft), "head": str(args.head),
               "context": args.context, "calls": args.calls, "machine": machine(),
               "git": git_state(), "runs": {}}
    invariants = {"auto": [False] if dtype == torch.float32 else [False, True], "on": [True],
                  "off": [False], "both": [False, True]}[args.invariant]
    kernels = {"auto": [True], "off": [False], "both": [True, False]}[args.invariant_kernels] \
        if device.type == "cuda" else [True]   # the CPU has its own blocks, no kernels
    for invariant, kernel, graphs in ((i, k, g) for i in invariants
                                      for k in (kernels if i else [True]) for g in settings):
        key = f"CUDA graphs {'on' if graphs else 'off'}" + (", invariant" if invariant else "") \
            + ("" if kernel else ", no Triton kernels")
        invariant_gemm.enabled = invariant_attention.enabled = kernel
        t1 = time.perf_counter()
        per_b = target_costs(model, head, medusa, args, device, graphs, invariant, timer)
        if draft is not None and not invariant:   # the draft's arithmetic is not the target's
            for b, r in draft_costs(draft, args, device, graphs, timer).items():
                per_b[b].update(r)
        for r in per_b.values():
            fits(r)
            r["implied"] = implied(r, args.ks, args.acceptance, args.lengths)
        results["runs"][key] = per_b
        print(f"{key}: {time.perf_counter() - t1:.0f} s", file=sys.stderr, flush=True)
        # Written after each setting: a run stopped at its time limit keeps what it measured.
        if device.type == "cuda":
            results["peak_gpu_bytes"] = torch.cuda.max_memory_allocated(device)
            results["invariant_kernels_probed"] = {**invariant_gemm.probed(),
                                                   **invariant_attention.probed()}
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results, args))
    return 0


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else machine()["cpu"]


if __name__ == "__main__":
    sys.exit(main())
