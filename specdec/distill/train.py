"""KL(target || draft) training: AdamW, linear warmup then cosine decay, checkpoints, resume.

The loss matches the target's whole next-token distribution at every position, not only its
argmax: a draft token is accepted with probability min(1, p/q), and at temperature 0 when the
draft's argmax is the target's, both of which the full distribution teaches best (DistillSpec).
The target runs in specdec's own engine (one copy of its weights, no gradients); the draft is a
transformers model with float32 weights, under bfloat16 autocast on CUDA.

A checkpoint holds the draft's trainable weights, the optimizer and the step; since each step's
batch is a function of the seed and the step alone (data.step_batch), a resumed run takes the
same steps as one that never stopped.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..runtime.engine import Engine
from ..runtime.batch import Batch
from . import data
from .report import latest_a4, summary

# Tests only: after step N, "interrupt:N" raises KeyboardInterrupt (Ctrl-C), "term:N" sends
# this process SIGTERM (a plain kill), "crash:N" raises a RuntimeError (a process killed hard:
# nothing saved beyond the last periodic checkpoint).
FAULT_ENV = "SPECDEC_DISTILL_TEST_FAULT"


def lr_scale(step: int, steps: int, warmup: int) -> float:
    """Linear warmup over `warmup` steps, then cosine decay to a tenth."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.45 * (1 + math.cos(math.pi * progress))


def optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn, lr: float) -> float:
    """One optimizer step at learning rate lr: loss_fn() under bf16 autocast on CUDA, gradients
    clipped to norm 1. Returns the loss."""
    for group in opt.param_groups:
        group["lr"] = lr
    device = next(model.parameters()).device.type
    # float32 on the CPU: without AVX-512 BF16 its bf16 matmuls are emulated (an EAGLE-3 head's
    # [58, 32000] x [32000, 256] gradient took 1.24 s against 0.018 s in float32 on our CI's AMD
    # EPYC; train_head's one step, the model's load included, 7.1 s against 1.0).
    with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = loss_fn()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


@torch.no_grad()
def teacher_hidden(target: Engine, tokens: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The target's final hidden states [B, T, D] for whole rows, in slots 0..B-1 of its pool
    (nothing else is open in it while training)."""
    b = tokens.shape[0]
    batch = Batch.build(tokens, [0] * b, list(range(b)), target.cache, target.device,
                        lengths.tolist())
    with torch.autocast(target.device.type, enabled=False):   # in its own dtype, as it serves
        return target.model(batch, target.cache)


def kl_loss(draft: torch.nn.Module, target: Engine, tokens: torch.Tensor, lengths: torch.Tensor,
            chunk: int) -> torch.Tensor:
    """Mean over real tokens of KL(target || draft), at temperature 1. Rows are right-padded
    (causal attention: padding never reaches a real token). Logits exist `chunk` tokens at a
    time, recomputed in backward: a 128k vocabulary would otherwise need V floats per token."""
    tokens = tokens.to(target.device)
    real = torch.arange(tokens.shape[1], device=tokens.device) < lengths.to(tokens.device)[:, None]
    t = teacher_hidden(target, tokens, lengths)[real]                       # [N, Dt]
    s = draft.model(input_ids=tokens, use_cache=False).last_hidden_state[real]  # [N, Ds]
    return mean_kl(student_head(draft), target, s, t, chunk)


def mean_kl(head, target: Engine, s: torch.Tensor, t: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean KL(target || student) over rows: the student's hidden states s [N, Ds] through
    head, the target's t [N, Dt] through its own logits."""
    if len(s) <= chunk:   # one piece: nothing to save by recomputing it in backward
        return _kl_sum(head, target.model, s, t) / len(s)
    total = sum(checkpoint(_kl_sum, head, target.model, s[i:i + chunk],
                           t[i:i + chunk], use_reentrant=False)
                for i in range(0, len(s), chunk))
    return total / len(s)


def student_head(draft: torch.nn.Module):
    """The draft's hidden states -> its logits as it will serve them: Gemma 2 caps them
    (final_logit_softcapping), the teacher's `logits` does too."""
    cap = getattr(draft.config, "final_logit_softcapping", None)
    if not cap:
        return draft.lm_head
    return lambda hidden: torch.tanh(draft.lm_head(hidden) / cap) * cap


def _kl_sum(head, teacher, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    student = head(s).float().log_softmax(-1)                               # [n, V]
    with torch.no_grad():
        target = teacher.logits(t).log_softmax(-1)
    return F.kl_div(student, target, log_target=True, reduction="sum")


def chunk_tokens(vocab: int) -> int:
    """Tokens per logits chunk: about 64 MiB of float32 logits per model."""
    return max(256, 2**24 // vocab)


def checkpoint_dirs(work: Path) -> list[Path]:
    return sorted(p for p in work.glob("step-*") if (p / "state.pt").is_file())


def save_checkpoint(work: Path, done: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    history: list) -> Path:
    """work/step-NNNNNNN/state.pt, written under another name first: a process killed while
    saving leaves the previous checkpoint whole. Older checkpoints are then removed."""
    final = work / f"step-{done:07d}"
    tmp = work / f".tmp-step-{done:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainable = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    torch.save({"step": done, "model": trainable, "optimizer": opt.state_dict(),
                "history": history}, tmp / "state.pt")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in checkpoint_dirs(work):
        if old != final:
            shutil.rmtree(old)
    return final


def load_checkpoint(work: Path, model: torch.nn.Module, opt: torch.optim.Optimizer
                    ) -> tuple[int, list]:
    """(steps done, history) of the latest checkpoint, loaded into model and opt; (0, [])."""
    found = checkpoint_dirs(work)
    if not found:
        return 0, []
    state = torch.load(found[-1] / "state.pt", map_location="cpu")
    missing = [n for n, p in model.named_parameters()
               if p.requires_grad and n not in state["model"]]
    if missing:
        raise RuntimeError(f"{found[-1]}: checkpoint lacks {missing[:3]}")
    model.load_state_dict(state["model"], strict=False)
    opt.load_state_dict(state["optimizer"])
    return state["step"], state["history"]


def fault(done: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    kind, at = spec.split(":")
    if int(at) == done:
        if kind == "interrupt":
            raise KeyboardInterrupt
        if kind == "term":
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)   # the handler raises here
        raise RuntimeError(f"{FAULT_ENV}: injected crash after step {done}")


def entry(done: int, losses: list[float], clock: float) -> dict:
    """A history entry for the steps since the last one (their mean loss, their seconds)."""
    return {"step": done, "loss": round(sum(losses) / len(losses), 4),
            "seconds": round(time.time() - clock, 1), "acceptance": None}


def by_part(key: str, train_step, parts):
    """A step that keeps each step's loss by part (`parts()` after train_step: one per head,
    or per training-time-test step), and the `extra` for run() that averages them into a
    history entry under `key` and starts over."""
    seen: list[list[float]] = []

    def step(tokens: torch.Tensor, lengths: torch.Tensor, lr: float) -> float:
        loss = train_step(tokens, lengths, lr)
        seen.append(parts())
        return loss

    def means() -> dict:
        out = {key: [round(sum(col) / len(col), 4) for col in zip(*seen)]}
        seen.clear()
        return out

    return step, means


def run(args, ds, work: Path, bar, slots: int, model: torch.nn.Module,
        opt: torch.optim.Optimizer, step, evaluate, what: str,
        extra=lambda: {}) -> tuple[list, dict]:
    """The distillation loop both methods share: the initial measurement, args.steps steps
    from the last checkpoint (resume), a checkpoint and a held-out measurement every
    args.checkpoint_every steps, the steps since the last checkpoint kept on Ctrl-C, then the
    final measurement (timed) of the model written to args.out.

    step(tokens, lengths, lr) -> loss; evaluate(directory, timed) -> measure's dict; what: the
    model's name in progress lines ("draft", "head"); extra() -> more fields for a history
    entry (read, then reset, by the caller's closure). Returns (history, final)."""
    done, history = load_checkpoint(work, model, opt)
    if not history:
        bar.reset(None)
        bar.set_description(f"measuring the initial {what}")
        history.append({"step": 0, "loss": None, "seconds": 0.0,
                        "acceptance": evaluate(work / "eval", timed=False)})
    bar.reset(args.steps)
    bar.update(done)
    bar.set_description(f"distill {args.method}")
    bar.set_postfix(a4=latest_a4(history))
    losses, clock = [], time.time()
    try:
        while done < args.steps:
            lr = args.lr * lr_scale(done, args.steps, args.warmup)
            tokens, lengths = data.step_batch(ds, done, args.seed, args.batch, args.seq_len, slots)
            losses.append(step(tokens, lengths, lr))
            done += 1
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}", a4=latest_a4(history))
            fault(done)
            if done % args.checkpoint_every == 0 or done == args.steps:
                history.append({**entry(done, losses, clock), **extra()})
                losses, clock = [], time.time()
                save_checkpoint(work, done, model, opt, history)
                if done < args.steps:   # the last one is measured below, with c
                    history[-1]["acceptance"] = evaluate(work / "eval", timed=False)
                bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", a4=latest_a4(history))
    except KeyboardInterrupt:
        if losses:   # steps since the last checkpoint: keep them
            history.append({**entry(done, losses, clock), **extra(), "interrupted": True})
            save_checkpoint(work, done, model, opt, history)
        raise
    bar.close()
    print(f"measuring the {what} (acceptance, c)", file=sys.stderr)
    final = evaluate(args.out, timed=True)
    history[-1]["acceptance"] = {k: final[k] for k in ("acceptance_by_position", "per_k")}
    return history, final


def finish(out: Path, work: Path, result: dict, written: str) -> int:
    """The run's end: its report beside the model, the work directory gone, the summary."""
    (out / "distill_report.json").write_text(json.dumps(result, indent=1) + "\n")
    shutil.rmtree(work)
    print(summary(result), file=sys.stderr)
    print(written, file=sys.stderr)
    return 0
