"""`specdec distill --method eagle3`: the run after the shared stages (checks, data), training an
EAGLE-3 head (eagle3.py) with checkpoints and resume as the draft's run has them, measured by
the served loop's proposals (measure.head_runs) and written in the speculators format.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from ..runtime.config import ModelArgs
from ..proposers.eagle.checkpoint import load_head, save_speculators
from ..proposers.eagle.head import EagleHead
from ..runtime.engine import Engine
from ..proposers.eagle.drafting import HeadDrafter
from ..runtime.kv_cache import KVCache
from . import data, draft, eagle3, measure, report, train
from .checks import DistillError, parameters

# Options of the draft method that mean nothing for a head, and the head's own.
DRAFT_ONLY = ("layers", "draft_config", "train_embeddings")
HEAD_ONLY = ("draft_vocab", "ttt_steps", "aux_layers")


def check_options(args: argparse.Namespace, t: ModelArgs) -> None:
    """Refuse options of the other method, and the head's out of range; fill the defaults."""
    model = args.method in ("draft", "pard")   # a draft model, not a head
    others = HEAD_ONLY if model else DRAFT_ONLY
    given = [o for o in others if getattr(args, o) not in (None, False)]
    if given:
        flags = ", ".join("--" + o.replace("_", "-") for o in given)
        raise DistillError(f"{flags}: not an option of --method {args.method} (they belong to "
                           f"--method {'eagle3' if model else 'draft'})")
    if model:
        return
    if args.draft_vocab is None:
        args.draft_vocab = eagle3.default_draft_vocab(t.vocab_size)
    if not 1 <= args.draft_vocab <= t.vocab_size:
        raise DistillError(f"--draft-vocab {args.draft_vocab}: must be within 1..{t.vocab_size} "
                           f"(the target's vocabulary)")
    if args.ttt_steps is None:
        args.ttt_steps = 3
    if not 1 <= args.ttt_steps <= 16:
        raise DistillError(f"--ttt-steps {args.ttt_steps}: must be within 1..16")
    if args.aux_layers is None:
        args.aux_layers = ",".join(map(str, eagle3.aux_layers(t.num_layers)))
    if len(parse_aux(args.aux_layers, t)) != 3:
        raise DistillError(f"--aux-layers {args.aux_layers}: EAGLE-3 fuses three layers "
                           f"(e.g. {','.join(map(str, eagle3.aux_layers(t.num_layers)))})")
    if args.lr is None:
        args.lr = min(3e-3, 0.5 / t.hidden_size)


def parse_aux(value: str, t: ModelArgs) -> tuple[int, ...]:
    try:
        aux = tuple(int(x) for x in value.split(","))
    except ValueError:
        raise DistillError(f"--aux-layers {value}: expected three layer indices, comma-separated "
                           f"(0-based; the layer whose output is fused)") from None
    bad = [i for i in aux if not 0 <= i < t.num_layers]
    if bad:
        raise DistillError(f"--aux-layers {value}: the target has layers 0..{t.num_layers - 1}")
    return aux


def head_parameters(t: ModelArgs, draft_vocab: int) -> int:
    """Trained parameters: fc, the layer (q/k/v read 2 H), its norms, the final norm, lm_head."""
    h, d, a = t.hidden_size, t.head_dim, eagle3.head_layer_args(t)
    attn = 2 * h * d * (a.num_heads + 2 * a.num_kv_heads) + a.num_heads * d * h
    return 3 * h * h + attn + 3 * h * a.intermediate_size + 4 * h + draft_vocab * h


def memory_needed(t: ModelArgs, args, slots: int, max_len: int,
                  dtype: torch.dtype) -> dict[str, int]:
    """Bytes at the peak of a step, by part (as checks.memory_needed for a draft): the head in
    float32 with AdamW, per TTT step what autograd keeps (the layer's activations in `dtype`:
    bf16 under autocast on CUDA, float32 on the CPU; its scores against step 0's keys in float32
    three times over: scores, softmax, the bf16 copy; the logits and log-probabilities when the
    step's tokens fit in one chunk), the teacher's outputs and one layer of its forward, one
    chunk of logits being computed; the measurement's KV pool comes on top while it runs."""
    elem = torch.empty((), dtype=dtype).element_size()
    tokens = args.batch * args.seq_len
    h, i = t.hidden_size, t.intermediate_size
    chunk = train.chunk_tokens(args.draft_vocab)
    per_step = tokens * (12 * h + 4 * i) * elem + 3 * args.batch * t.num_heads * args.seq_len ** 2 \
        * 4 + (tokens * args.draft_vocab * 6 if tokens <= chunk else 0)
    teacher = tokens * 4 * h * elem + tokens * (
        3 * i + (t.num_heads + 2 * t.num_kv_heads) * t.head_dim) * elem
    kv = KVCache.bytes_needed(t.num_layers, slots, max_len, t.num_kv_heads, t.head_dim, dtype)
    return {
        "target weights": parameters(t)[0] * elem,
        "target KV pool": kv,
        "head training state": head_parameters(t, args.draft_vocab) * 16,
        "activations": args.ttt_steps * per_step + teacher + chunk * args.draft_vocab * 4 * 5,
        "measurement KV pool": KVCache.bytes_needed(t.num_layers + 1, args.eval_prompts,
                                                    max_len, t.num_kv_heads, t.head_dim, dtype),
    }


def run(args, t_args: ModelArgs, t_cfg: dict, target: Engine, ds: data.Data, work: Path,
        bar, device: torch.device, max_len: int, started: float) -> int:
    model = target.model
    aux = parse_aux(args.aux_layers, t_args)
    counts = eagle3.token_counts(ds, t_args.vocab_size)
    used = eagle3.draft_vocabulary(counts, args.draft_vocab)
    coverage = float(counts[used].sum() / counts.sum().clamp(min=1))
    head = eagle3.new_head(model, aux, used, args.seed)
    trainer = eagle3.Trainer(model, head, used, target.cache.num_slots, max_len, args.lr,
                             args.ttt_steps, cache=target.cache)
    trainable = sum(p.numel() for p in head.parameters() if p.requires_grad)
    save_dtype = draft.save_dtype(t_cfg)

    def evaluate(directory: Path, timed: bool) -> dict:
        save(head, directory, args, t_cfg, save_dtype)
        return measure_head(model, directory, ds.heldout, ds.continuations, args.max_k,
                            max_len, target.dtype, device, timed)

    step, ttt_losses = train.by_part("loss_by_ttt_step", trainer.step,
                                     lambda: trainer.last_steps)
    history, final = train.run(args, ds, work, bar, target.cache.num_slots, head, trainer.opt,
                               step, evaluate, "head", ttt_losses)
    result = report.build_eagle3(args=args, target=t_args, aux=aux, used=used,
                                 coverage=coverage, trainable=trainable, device=device,
                                 sources=ds.sources, history=history, final=final,
                                 seconds=sum(h["seconds"] for h in history))
    return train.finish(args.out, work, result, f"{args.out}: EAGLE-3 head written in "
                        f"{time.time() - started:.0f} s (speculators format)")


def save(head: EagleHead, directory: Path, args, t_cfg: dict, dtype: torch.dtype) -> None:
    save_speculators(head, directory, str(args.target), dtype=dtype, embeddings=False,
                     verifier_architectures=t_cfg.get("architectures"),
                     speculative_tokens=min(args.max_k, 4))


def measure_head(model, directory: Path, prompts: list[list[int]], conts: list[list[int]],
                 max_k: int, max_len: int, dtype: torch.dtype, device: torch.device,
                 timed: bool) -> dict:
    """The saved head served as the server loads it (load_head beside the target), measured
    over the held-out prompts; the target's capture is restored after."""
    kept = model.capture
    try:
        head = load_head(directory, model, dtype, device)
        engine = Engine(model, len(prompts), max_len, device, cuda_graphs=False,
                        head=HeadDrafter(head))
        acc = measure.acceptance(measure.head_runs(engine, prompts, conts, max_k), max_k)
        if not timed:
            return acc
        return measure.predict(acc, measure.head_cost_ratio(engine, prompts[0]))
    finally:
        model.capture = kept
