"""`specdec distill --method medusa`: Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference
Acceleration Framework with Multiple Decoding Heads") trained for a frozen target on the shared
stages' data (the target's own continuations, a corpus it scores), with checkpoints and resume as
the draft's run has them, written in FasterDecoding's layout (specdec/proposers/medusa/).

Head i at position t reads the target's final hidden state there, the one that gave the target's
next token x[t + 1], and learns the target's distribution at position t + 1 + i, over
x[t + 2 + i]: loss_i is KL(target || head i) there (cross-entropy against the target's whole
distribution, less its entropy: on sampled rows and corpus windows a lower-variance label than
the one token there, and on greedy rows the same argmax), weighted 0.8^i as Medusa-1 weights its
heads, normalised. Heads start as Medusa's trainer starts them: each block the identity (weight
zero), each LM head a copy of the target's.

Measured at temperature 0 on the held-out prompts: at every committed position of the target's
greedy continuation the heads guess the next K tokens from one hidden state, as they will when
served, and the rounds of specdec's loop are replayed over those guesses (measure.acceptance);
c is the heads' time per drafted token over the target's time for one token.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..runtime.config import ModelArgs
from ..runtime.engine import Engine
from ..runtime.kv_cache import KVCache
from ..proposers.medusa.checkpoint import load_medusa, save_medusa
from ..proposers.medusa.config import MAX_HEADS, MedusaArgs
from ..proposers.medusa.head import MedusaHead
from ..runtime.model import Transformer
from ..records import VerifyCall
from . import data, draft, measure, report, train
from .checks import DistillError, parameters
from .eagle3_run import DRAFT_ONLY, HEAD_ONLY

DECAY = 0.8                  # head i's loss weight is DECAY ** i (Medusa-1's lambda_k = 0.8^k)
MEDUSA_ONLY = ("medusa_heads", "medusa_layers")
LOSS = "KL(target || head i) at the target's position t + 1 + i, weighted 0.8^i"


def check_options(args: argparse.Namespace, t: ModelArgs) -> None:
    """Refuse the other methods' options with --method medusa, and its own with theirs; fill
    the defaults. K measured is at most the number of heads: a round drafts one token a head."""
    if args.method != "medusa":
        given = [o for o in MEDUSA_ONLY if getattr(args, o) is not None]
        if given:
            raise DistillError(f"{_flags(given)}: not an option of --method {args.method} (they "
                               f"belong to --method medusa)")
        return
    given = [o for o in DRAFT_ONLY + HEAD_ONLY if getattr(args, o) not in (None, False)]
    if given:
        raise DistillError(f"{_flags(given)}: not an option of --method medusa")
    args.medusa_heads = 4 if args.medusa_heads is None else args.medusa_heads
    args.medusa_layers = 1 if args.medusa_layers is None else args.medusa_layers
    if not 1 <= args.medusa_heads <= MAX_HEADS:
        raise DistillError(f"--medusa-heads {args.medusa_heads}: must be within 1..{MAX_HEADS}")
    if not 0 <= args.medusa_layers <= 8:
        raise DistillError(f"--medusa-layers {args.medusa_layers}: must be within 0..8")
    args.max_k = min(args.max_k, args.medusa_heads)
    if args.lr is None:
        args.lr = min(3e-3, 0.5 / t.hidden_size)


def _flags(options: list[str]) -> str:
    return ", ".join("--" + o.replace("_", "-") for o in options)


def heads_parameters(t: ModelArgs, heads: int, layers: int) -> int:
    h = t.hidden_size
    return heads * (layers * (h * h + h) + t.vocab_size * h)


def memory_needed(t: ModelArgs, args, slots: int, max_len: int,
                  dtype: torch.dtype) -> dict[str, int]:
    """Bytes at the peak of a step, by part (as checks.memory_needed for a draft): the heads in
    float32 with AdamW; the teacher's hidden states and one layer of its forward; per head the
    rows autograd keeps for the recomputed chunks (source and target hidden states); one chunk
    of both distributions being computed; the measurement's rows."""
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = args.batch * args.seq_len
    h, i = t.hidden_size, t.intermediate_size
    teacher = tokens * h * elem + tokens * (
        3 * i + (t.num_heads + 2 * t.num_kv_heads) * t.head_dim) * elem
    per_head = tokens * h * 2 * elem
    chunk = train.chunk_tokens(t.vocab_size)
    return {
        "target weights": parameters(t)[0] * elem,
        "target KV pool": KVCache.bytes_needed(t.num_layers, slots, max_len, t.num_kv_heads,
                                               t.head_dim, dtype),
        "heads training state": heads_parameters(t, args.medusa_heads, args.medusa_layers) * 16,
        "activations": teacher + args.medusa_heads * per_head + chunk * t.vocab_size * 4 * 5,
    }


def new_heads(model: Transformer, heads: int, layers: int, seed: int = 0) -> MedusaHead:
    """Heads in float32 on the target's device, as Medusa's trainer starts them: blocks at the
    identity (weights zero, biases as torch draws them, seeded), LM heads the target's."""
    a = model.args
    lm_head = model.lm_head.weight
    with torch.random.fork_rng(devices=[lm_head.device] if lm_head.device.type == "cuda" else []):
        torch.manual_seed(seed)
        head = MedusaHead(MedusaArgs(heads, layers, a.hidden_size, a.vocab_size)).to(lm_head.device)
    with torch.no_grad():
        for layers_i in head.heads:
            for block in layers_i[:-1]:
                block.linear.weight.zero_()
            layers_i[-1].weight.copy_(lm_head[: a.vocab_size].float())
    return head


class Trainer:
    """The heads' training state: the heads, their optimizer, the frozen target (its engine's
    KV pool holds the teacher's rows) and each head's KL at the last step."""

    def __init__(self, target: Engine, head: MedusaHead, lr: float):
        self.target, self.head = target, head
        self.chunk = train.chunk_tokens(target.model.args.vocab_size)
        self.opt = train.optimizer(head, lr)
        self.last_heads: list[float] = []

    def step(self, tokens: torch.Tensor, lengths: torch.Tensor, lr: float) -> float:
        device = self.target.device

        def loss():
            hidden = train.teacher_hidden(self.target, tokens.to(device), lengths)
            value, self.last_heads = medusa_loss(self.head, self.target.model, hidden,
                                                 lengths.to(device), self.chunk)
            return value
        self.head.train()
        return train.step(self.head, self.opt, loss, lr)


def train_heads(target: Engine, sequences: list[list[int]], steps: int, *, heads: int = 4,
                layers: int = 1, batch: int = 8, lr: float = 1e-2, warmup: int = 5,
                seed: int = 0) -> MedusaHead:
    """Heads trained for `steps` steps on `sequences` (token lists the target wrote), `batch`
    of them per step: the run's core without its data, checkpoints or measurement (tests).
    `target` needs `batch` slots as long as the longest sequence."""
    lengths = torch.tensor([len(s) for s in sequences])
    rows = torch.zeros(len(sequences), int(lengths.max()), dtype=torch.int64)
    for i, s in enumerate(sequences):
        rows[i, : len(s)] = torch.tensor(s)
    ds = data.Data(rows, lengths, torch.zeros(0, dtype=torch.int64), [], {})
    trainer = Trainer(target, new_heads(target.model, heads, layers, seed), lr)
    for i in range(steps):
        tokens, lens = data.step_batch(ds, i, seed, batch, rows.shape[1], batch)
        trainer.step(tokens, lens, lr * train.lr_scale(i, steps, warmup))
    return trainer.head.eval().requires_grad_(False)


def medusa_loss(head: MedusaHead, model: Transformer, hidden: torch.Tensor,
                lengths: torch.Tensor, chunk: int) -> tuple[torch.Tensor, list[float]]:
    """(sum_i 0.8^i KL_i / sum_i 0.8^i, [KL_i]): KL_i the mean over positions t of right-padded
    rows (hidden [B, T, H], the target's) where t + 1 + i is a real token."""
    t = torch.arange(hidden.shape[1], device=hidden.device)
    total, per_head = 0.0, []
    for i, layers in enumerate(head.heads):
        shift = i + 1
        valid = (t[:-shift] + shift)[None] < lengths[:, None]                 # [B, T - shift]
        source = hidden[:, :-shift][valid]                                    # [M, H] at t
        target = hidden[:, shift:][valid]                                     # [M, H] at t + 1 + i
        kl = _kl(layers, model, source, target, chunk) / max(1, len(source))
        per_head.append(kl.item())
        total = total + DECAY ** i * kl
    return total / sum(DECAY ** i for i in range(len(head.heads))), per_head


def _kl(layers: nn.Module, model: Transformer, s: torch.Tensor, t: torch.Tensor,
        chunk: int) -> torch.Tensor:
    """Summed KL over rows, `chunk` rows of V logits at a time (recomputed in backward when
    there is more than one chunk: a 128k vocabulary would otherwise need V floats a row)."""
    if len(s) <= chunk:
        return _kl_sum(layers, model, s, t)
    return sum(checkpoint(_kl_sum, layers, model, s[i:i + chunk], t[i:i + chunk],
                          use_reentrant=False) for i in range(0, len(s), chunk))


def _kl_sum(layers: nn.Module, model: Transformer, s: torch.Tensor, t: torch.Tensor):
    student = layers(s).float().log_softmax(-1)                                  # [m, V]
    with torch.no_grad():
        target = model.logits(t).log_softmax(-1)
    return F.kl_div(student, target, log_target=True, reduction="sum")


@torch.no_grad()
def guesses(target: Engine, head: MedusaHead, prompts: list[list[int]],
            conts: list[list[int]]) -> list[torch.Tensor]:
    """Per prompt [N - 1, K]: the heads' greedy guesses at each committed position i = 1..N-1 of
    its continuation (N tokens), from the hidden state that gave conts[p][i - 1]: guesses for
    conts[p][i:i + K]. One target forward over all rows, in slots 0..P-1 of its pool."""
    rows = [p + c for p, c in zip(prompts, conts)]
    lengths = torch.tensor([len(r) for r in rows])
    tokens = torch.zeros(len(rows), int(lengths.max()), dtype=torch.int64)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
    hidden = train.teacher_hidden(target, tokens.to(target.device), lengths)
    return [head(hidden[i, len(p) - 1: len(p) + len(c) - 2]).argmax(-1).cpu()
            for i, (p, c) in enumerate(zip(prompts, conts))]


def acceptance(found: list[torch.Tensor], conts: list[list[int]], k: int) -> dict:
    """measure.acceptance over the loop's rounds at every K <= k, and head_top1: each head's
    greedy guess against the target's token at its offset, whatever the heads before it
    guessed (the served acceptance at position i needs heads 0..i all right)."""
    runs, hits, seen = [], [0] * k, [0] * k
    for g, c in zip(found, conts):
        run = [0] * len(c)
        for i in range(1, len(c)):
            ahead = c[i:i + k]
            same = [int(a) == b for a, b in zip(g[i - 1].tolist(), ahead)]
            run[i] = next((j for j, ok in enumerate(same) if not ok), len(same))
            for j, ok in enumerate(same):
                hits[j] += ok
                seen[j] += 1
        runs.append(run)
    acc = measure.acceptance(runs, k)
    acc["head_top1"] = [round(h / s, 4) if s else None for h, s in zip(hits, seen)]
    return acc


def cost_ratio(target: Engine, head: MedusaHead, prompt: list[int], repeats: int = 20) -> float:
    """c: the heads' seconds per drafted token (all K at once, to their greedy ids on the host)
    over the target's seconds for one token, one sequence at a time, medians of alternating
    calls."""
    n, k = len(prompt), head.args.num_heads
    greedy = measure.GREEDY
    target.verify([VerifyCall(0, 0, prompt, [], None, greedy)])
    hidden = torch.zeros(1, head.args.hidden_size, dtype=target.dtype, device=target.device)
    t_times, d_times = [], []
    for r in range(repeats + 3):   # the first three warm up
        t0 = time.perf_counter()
        target.verify([VerifyCall(0, n - 1, prompt[-1:], [], None, greedy)])
        t1 = time.perf_counter()
        head(hidden).argmax(-1).tolist()
        t2 = time.perf_counter()
        if r >= 3:
            t_times.append(t1 - t0)
            d_times.append((t2 - t1) / k)
    target.release([0])
    return statistics.median(d_times) / statistics.median(t_times)


def measure_heads(target: Engine, head: MedusaHead, prompts: list[list[int]],
                  conts: list[list[int]], timed: bool) -> dict:
    acc = acceptance(guesses(target, head, prompts, conts), conts, head.args.num_heads)
    return measure.predict(acc, cost_ratio(target, head, prompts[0])) if timed else acc


def run(args, t_args: ModelArgs, t_cfg: dict, target: Engine, ds: data.Data, work: Path,
        bar, device: torch.device, started: float) -> int:
    head = new_heads(target.model, args.medusa_heads, args.medusa_layers, args.seed)
    trainer = Trainer(target, head, args.lr)
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    save_dtype = draft.save_dtype(t_cfg)

    def evaluate(directory: Path, timed: bool) -> dict:
        save_medusa(head, directory, str(args.target), save_dtype)
        served = load_medusa(directory, t_args, target.dtype, device)   # as the server loads it
        return measure_heads(target, served, ds.heldout, ds.continuations, timed)

    step, head_losses = train.by_part("loss_by_head", trainer.step, lambda: trainer.last_heads)
    history, final = train.run(args, ds, work, bar, target.cache.num_slots, head, trainer.opt,
                               step, evaluate, "heads", head_losses)
    result = build_report(args=args, target=t_args, trainable=trainable, device=device,
                          sources=ds.sources, history=history, final=final,
                          seconds=sum(h["seconds"] for h in history))
    s = result["summary"]
    verdict = (f"they pay: predicted {s['predicted_speedup_best_k']}x at K={s['best_k']}"
               if s["pays"] else f"they do not pay here (predicted "
               f"{s['predicted_speedup_best_k']}x at best, K={s['best_k']}): serve without them")
    return train.finish(args.out, work, result, f"{args.out}: Medusa-1 heads written in "
                        f"{time.time() - started:.0f} s (FasterDecoding layout); {verdict}")


def build_report(*, args, target: ModelArgs, trainable: int, device: torch.device,
                 sources: dict, history: list, final: dict, seconds: float) -> dict:
    """The draft's report with the heads in place of the draft: their shape, the loss by head,
    each head's top-1 agreement with the target, and whether they pay (a predicted speedup
    over the target alone above 1 at the best K)."""
    trained = [h for h in history if h.get("loss") is not None]
    k4 = final["per_k"].get(4)
    header, best, tail = report._common(args, target, device, sources, history, final)
    return {
        "method": "medusa", **header,
        "heads": {"format": "FasterDecoding Medusa-1", "medusa_num_heads": args.medusa_heads,
                  "medusa_num_layers": args.medusa_layers, "hidden_size": target.hidden_size,
                  "vocab_size": target.vocab_size, "trainable_parameters": trainable},
        "data": sources,
        "training": {**report._training(args, seconds), "loss": LOSS,
                     "final_loss": trained[-1]["loss"] if trained else None,
                     "final_loss_by_head": trained[-1]["loss_by_head"] if trained else None},
        "summary": {"a_k4": k4["a"] if k4 else None,
                    "accepted_per_round_k4": k4["accepted_per_round"] if k4 else None,
                    "tokens_per_round_k4": k4["tokens_per_round"] if k4 else None,
                    "predicted_speedup_k4": k4["predicted_speedup"] if k4 else None,
                    "head_top1": final["head_top1"], **best,
                    "pays": best["predicted_speedup_best_k"] > 1.0},
        **tail,
    }
