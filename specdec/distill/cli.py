"""specdec distill: train a draft from the target itself (docs/distill.md).

    specdec distill --target DIR --out DIR [--prompts FILE] [--corpus PATH]
                    [--layers N | --draft-config FILE] [--steps N] [--device auto|cpu|cuda]
    specdec distill --method eagle3 --target DIR --out DIR [--draft-vocab N] [--ttt-steps N]
                    [--aux-layers A,B,C] ...
    specdec distill --method medusa --target DIR --out DIR [--medusa-heads N] [--medusa-layers N]
    specdec distill --method pard --target DIR --out DIR [--from-draft DIR] [--pard-k N]

Stages, each resumable: checks, data (saved to OUT/.distill/data.pt), training (checkpoints in
OUT/.distill/step-N), then the draft is written to OUT as a Hugging Face directory (an EAGLE-3
head: in the speculators format, eagle3_run.py; Medusa heads: in FasterDecoding's, medusa.py)
with distill_report.json, and OUT/.distill is removed.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import signal
import sys
import time
from pathlib import Path

import torch

from ..runtime.config import CheckpointError, ModelArgs
from ..runtime.engine import Engine, default_dtype
from . import checks, data, draft, eagle3_run, measure, medusa, pard, report, train
from .checks import WORK, DistillError

GEN_BATCH = 64          # sequences the target continues at once
# Options that may change between an interrupted run and its resumption.
NOT_RECIPE = {"out", "steps", "checkpoint_every", "device", "threads", "overwrite"}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--target", type=Path, required=True, help="the target's checkpoint directory")
    ap.add_argument("--out", type=Path, required=True, help="the draft's directory (new or empty)")
    ap.add_argument("--method", choices=("draft", "eagle3", "medusa", "pard"), default="draft",
                    help="draft: a small model of the target's layers (default); eagle3: an "
                    "EAGLE-3 head drafting from the target's hidden states; medusa: Medusa-1 "
                    "heads guessing the next tokens from the target's last hidden state; pard: "
                    "a draft model proposing K tokens in one pass (PARD)")
    g = ap.add_argument_group("data (default: the target's own samples)")
    g.add_argument("--prompts", type=Path, help="prompts the target continues: JSON lines with "
                   "a 'prompt' field, or one per line; chat-templated for chat models")
    g.add_argument("--corpus", type=Path, help="text the target scores: a file, a .jsonl of "
                   "'text' fields, or a directory of text files; its windows are also prompts")
    g.add_argument("--heldout", type=Path, help="held-out prompts for measuring acceptance "
                   "(default: 5 %% of --prompts, the corpus' last 5 %%, or target samples)")
    g.add_argument("--gen-sequences", type=int, default=2048, help="continuations the target "
                   "writes (default 2048)")
    g.add_argument("--gen-tokens", type=int, default=128, help="tokens per continuation (128)")
    g.add_argument("--prompt-tokens", type=int, default=32,
                   help="length of prompts cut from the corpus or sampled (32)")
    g.add_argument("--greedy-fraction", type=float, default=0.5,
                   help="continuations written greedily; the rest are sampled (0.5)")
    g.add_argument("--temperature", type=float, default=1.0, help="for sampled ones (1.0)")
    g.add_argument("--no-chat-template", action="store_true",
                   help="use prompts as they are even when the tokenizer has a chat template")
    g = ap.add_argument_group("draft (default: a copy of an eighth of the target's layers, at "
                              "least 2)")
    x = g.add_mutually_exclusive_group()
    x.add_argument("--layers", type=int, help="copy this many of the target's layers, evenly "
                   "spaced, first and last included")
    x.add_argument("--draft-config", type=Path, help="a config.json (or the fields that differ "
                   "from the target's) for a draft trained from scratch on the target's vocabulary")
    g.add_argument("--train-embeddings", action="store_true", help="train the copied "
                   "embeddings and LM head too (default: frozen, the target's)")
    g = ap.add_argument_group("EAGLE-3 head (--method eagle3)")
    g.add_argument("--draft-vocab", type=int, help="the head's vocabulary: the most frequent "
                   "target ids in the data (default: the target's, at most 32000)")
    g.add_argument("--ttt-steps", type=int, help="training-time test steps unrolled (3)")
    g.add_argument("--aux-layers", help="three target layers whose outputs the head fuses, "
                   "0-based, e.g. 1,15,28 (default: EAGLE-3's 1, L/2-1, L-4; spread for L < 7)")
    g = ap.add_argument_group("Medusa-1 heads (--method medusa)")
    g.add_argument("--medusa-heads", type=int, help="heads, one per drafted token (4)")
    g.add_argument("--medusa-layers", type=int, help="residual blocks per head (1)")
    g = ap.add_argument_group("parallel draft (--method pard; else as --method draft)")
    g.add_argument("--from-draft", type=Path, help="an autoregressive draft checkpoint to "
                   "convert (default: a copy of the target's layers, as --method draft)")
    g.add_argument("--pard-k", type=int, help="tokens it learns to propose in one pass (4)")
    g.add_argument("--pard-token", type=int, help="its mask token's id (default: the first "
                   "vocabulary row the tokenizer never yields, else a row appended)")
    g = ap.add_argument_group("training")
    g.add_argument("--steps", type=int, default=1000, help="optimizer steps (1000)")
    g.add_argument("--batch", type=int, default=16, help="sequences per step (16)")
    g.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (256)")
    g.add_argument("--lr", type=float, help="peak learning rate (default 0.5 / the draft's "
                   "hidden size, at most 3e-3)")
    g.add_argument("--warmup", type=int, default=50, help="warmup steps (50)")
    g.add_argument("--checkpoint-every", type=int, default=100,
                   help="steps between checkpoints and held-out measurements (100)")
    g.add_argument("--seed", type=int, default=0)
    g = ap.add_argument_group("measurement")
    g.add_argument("--eval-prompts", type=int, default=32, help="held-out prompts used (32)")
    g.add_argument("--eval-tokens", type=int, default=64, help="target tokens per prompt (64)")
    g.add_argument("--max-k", type=int, default=8, help="largest K measured (8)")
    g = ap.add_argument_group("run")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: cuda when available; the target in bfloat16 there, float32 on CPU")
    g.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's choice)")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the checkpoint in --out, or restart an interrupted run")


def run(args: argparse.Namespace) -> int:
    _keep_freed_memory()
    # A plain `kill` (or a scheduler's preemption) stops the run as Ctrl-C does: saving.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run(args)
    except (DistillError, CheckpointError) as e:
        print(f"specdec distill: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nspecdec distill: interrupted; rerun the same command to resume from "
              f"{args.out / WORK}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _keep_freed_memory() -> None:
    """glibc hands every large freed block back to the kernel (mmap), so each training step
    faulted its big tensors in afresh: on the CPU a third of the run's time went to the kernel
    (0.75 of 2.8 CPU seconds per default eagle3 step, 500k page faults). Keep them for reuse."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.mallopt(-4, 0)            # M_MMAP_MAX: no block of its own for large allocations
        libc.mallopt(-1, 2**31 - 1)    # M_TRIM_THRESHOLD: never shrink the heap
    except (OSError, AttributeError, TypeError):   # not glibc: nothing to tune
        pass


def _run(args: argparse.Namespace) -> int:
    import transformers
    from tqdm import tqdm
    from transformers import AutoTokenizer

    transformers.utils.logging.disable_progress_bar()   # one bar: ours

    started = time.time()
    device = _device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_args, t_cfg = checks.target(args.target)
    medusa.check_options(args, t_args)
    if args.method != "medusa":
        eagle3_run.check_options(args, t_args)
    converted = pard.check_options(args, t_args)
    if args.method == "eagle3":
        cfg, idx, init, d_args = None, None, f"EAGLE-3 head, aux layers {args.aux_layers}", None
    elif args.method == "medusa":
        cfg, idx, d_args = None, None, None
        init = f"{args.medusa_heads} Medusa-1 heads of {args.medusa_layers} blocks"
    elif converted is not None:
        cfg, idx, d_args = None, None, converted
        init = f"parallel draft converted from {args.from_draft}"
    elif args.draft_config:
        cfg, idx = draft.user_config(t_cfg, args.target, args.draft_config), None
        init = f"from scratch, config {args.draft_config}"
    else:
        n = args.layers or draft.default_layers(t_args.num_layers)
        if not 1 <= n <= t_args.num_layers:
            raise DistillError(f"--layers {n}: the target has {t_args.num_layers} layers")
        idx = draft.layer_indices(t_args.num_layers, n)
        cfg = draft.layer_copy_config(t_cfg, idx)
        init = f"target layers {idx} of {t_args.num_layers}"
    if cfg is not None:
        d_args = ModelArgs.from_dict(cfg)
    if args.lr is None:
        args.lr = min(3e-3, 0.5 / d_args.hidden_size)
    max_len = args.seq_len + args.eval_tokens + args.max_k + 1
    _check_sizes(args, t_args, max_len)
    resume = checks.output_dir(args.out, args.overwrite)
    slots = max(2 * args.batch, GEN_BATCH, args.eval_prompts)
    freeze = (idx is not None or converted is not None) and not args.train_embeddings
    copies = args.pard_k if args.method == "pard" else 1   # a row per mask copy
    dtype = default_dtype(device)
    if args.method == "eagle3":
        parts = eagle3_run.memory_needed(t_args, args, slots, max_len, dtype)
    elif args.method == "medusa":
        parts = medusa.memory_needed(t_args, args, slots, max_len, dtype)
    else:
        parts = checks.memory_needed(t_args, d_args, not freeze, args.batch * copies, args.seq_len,
                                     slots, max_len, dtype, train.chunk_tokens(t_args.vocab_size))
    checks.memory(parts, device, args.batch, args.seq_len)
    print(f"{init}; about {sum(parts.values()) / 2**30:.1f} GiB on {device} ("
          + ", ".join(f"{k} {v / 2**30:.1f}" for k, v in parts.items()) + ")", file=sys.stderr)
    work = args.out / WORK
    _recipe(args, work, resume)

    bar = tqdm(total=args.steps, file=sys.stderr, dynamic_ncols=True, leave=True)
    tokenizer = AutoTokenizer.from_pretrained(str(args.target), local_files_only=True)
    target = Engine.load(str(args.target), slots, max_len, dtype, device, cuda_graphs=False)
    eos = t_args.eos_token_ids
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else (eos or (0,))[0]
    if (work / "data.pt").is_file():
        ds = data.Data.load(work / "data.pt")
    else:
        ds = data.build(args, tokenizer, target, eos, bos, args.seq_len - args.gen_tokens,
                        args.seq_len, bar)
        bar.reset(None)
        bar.set_description("target continues held-out prompts")
        ds.continuations = measure.continuations(target, ds.heldout, args.eval_tokens)
        ds.save(work / "data.pt")
    if args.method == "eagle3":
        return eagle3_run.run(args, t_args, t_cfg, target, ds, work, bar, device, max_len,
                              started)
    if args.method == "medusa":
        return medusa.run(args, t_args, t_cfg, target, ds, work, bar, device, started)

    if converted is not None:
        model = pard.from_draft(args.from_draft).to(device)
    else:
        model = draft.build(cfg, args.target, idx, args.seed).to(device)
    if freeze:
        draft.freeze_embeddings(model)
    if args.method == "pard":
        mask = pard.mask_token(len(tokenizer), d_args.vocab_size, args.pard_token)
        pard.prepare(model, mask, freeze)
    opt = train.optimizer(model, args.lr)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    save_dtype = draft.save_dtype(t_cfg)

    def evaluate(directory: Path, timed: bool) -> dict:
        draft.save(model, args.target, directory, save_dtype)
        d = Engine.load(str(directory), len(ds.heldout), max_len, dtype, device,
                        vocab_size=target.vocab_size, cuda_graphs=False)
        return measure.measure(target, d, ds.heldout, ds.continuations, args.max_k, timed)

    chunk = train.chunk_tokens(t_args.vocab_size)

    def step(tokens, lengths, lr: float) -> float:
        if args.method == "pard":
            return train.step(model, opt, lambda: pard.loss(
                model, target, tokens, lengths, args.pard_k, mask, chunk), lr)
        return train.step(model, opt, lambda: train.kl_loss(
            model, target, tokens, lengths, chunk), lr)

    history, final = train.run(args, ds, work, bar, slots, model, opt, step, evaluate, "draft")
    result = report.build(args=args, target=t_args, draft=d_args, init=init, trainable=trainable,
                          device=device, sources=ds.sources, history=history, final=final,
                          seconds=sum(h["seconds"] for h in history))
    return train.finish(args.out, work, result, f"{args.out}: draft written in "
                        f"{time.time() - started:.0f} s; serve it with "
                        f"SPECDEC_DRAFT_MODEL={args.out}")


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise DistillError("--device cuda: no CUDA device is available")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _check_sizes(args, t: ModelArgs, max_len: int) -> None:
    if max_len > t.max_position_embeddings:
        raise DistillError(f"--seq-len {args.seq_len} + --eval-tokens {args.eval_tokens} + "
                           f"--max-k {args.max_k} exceed the target's max_position_embeddings "
                           f"{t.max_position_embeddings}")
    if not 0 < args.gen_tokens < args.seq_len or not 0 < args.prompt_tokens < args.seq_len:
        raise DistillError("--gen-tokens and --prompt-tokens must be within 1..--seq-len - 1")
    if min(args.batch, args.checkpoint_every, args.eval_prompts, args.eval_tokens,
           args.max_k) < 1 or args.steps < 0 or args.gen_sequences < 0:
        raise DistillError("--batch, --checkpoint-every, --eval-prompts, --eval-tokens and "
                           "--max-k must be >= 1, --steps and --gen-sequences >= 0")
    if args.eval_tokens < 2:
        raise DistillError("--eval-tokens must be >= 2")
    if args.steps and not args.gen_sequences and not args.corpus:
        raise DistillError("no training data: --gen-sequences 0 needs a --corpus")


def _recipe(args, work: Path, resume: bool) -> None:
    """Write the options a resumed run must share; on resume, refuse if they changed."""
    recipe = {k: str(v) if isinstance(v, Path) else v for k, v in sorted(vars(args).items())
              if k not in NOT_RECIPE and k != "func"}
    file = work / "run.json"
    if resume:
        old = json.loads(file.read_text())
        changed = [f"--{k.replace('_', '-')} {old[k]} -> {v}" for k, v in recipe.items()
                   if k in old and old[k] != v]   # options added since that run: not in old
        if changed:
            raise DistillError(f"{file}: the interrupted run used other options ("
                               f"{'; '.join(changed)}): rerun with the same ones to resume, "
                               f"or pass --overwrite to start over")
        print(f"resuming the run in {work}", file=sys.stderr)
        return
    work.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps(recipe, indent=1) + "\n")

