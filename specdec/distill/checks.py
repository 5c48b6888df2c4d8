"""Refusals before any work starts, each naming the path or option at fault."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from ..runtime.config import ModelArgs
from ..runtime.memory import free_memory
from ..runtime.kv_cache import KVCache

WORK = ".distill"   # the run's data and checkpoints, inside --out until the run completes
# What --overwrite may delete from --out: a checkpoint directory's files, and our work dir.
REPLACEABLE = ("*.safetensors", "*.safetensors.index.json", "*.json", "tokenizer.model",
               "merges.txt", "vocab.json", "*.jinja", WORK)


class DistillError(ValueError):
    """A run that cannot start or continue; the message names the path or option."""


def target(path: Path) -> tuple[ModelArgs, dict]:
    """The target's architecture and raw config.json; CheckpointError for a missing directory
    or an unsupported family (config.py's messages), DistillError for a missing tokenizer."""
    args = ModelArgs.from_dir(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model")):
        raise DistillError(f"{path}: no tokenizer.json or tokenizer.model (the draft is trained "
                           f"on the target's own tokenizer)")
    return args, json.loads((path / "config.json").read_text())


def output_dir(out: Path, overwrite: bool) -> bool:
    """True when `out` holds an interrupted run to resume. Empties it with --overwrite."""
    if not out.exists():
        return False
    if not out.is_dir():
        raise DistillError(f"--out {out}: exists and is not a directory")
    entries = sorted(p.name for p in out.iterdir())
    if not entries:
        return False
    if overwrite:
        _clear(out)
        return False
    if (out / WORK / "run.json").is_file():
        return True
    raise DistillError(f"--out {out}: not empty ({len(entries)} entries: "
                       f"{', '.join(entries[:4])}{', ...' if len(entries) > 4 else ''}); "
                       f"pass --overwrite to replace it, or choose another directory")


def _clear(out: Path) -> None:
    ours = {p for pattern in REPLACEABLE for p in out.glob(pattern)}
    others = sorted(p.name for p in out.iterdir() if p not in ours)
    if others:  # checked before deleting anything: --overwrite never empties a foreign directory
        raise DistillError(f"--out {out}: --overwrite replaces only checkpoint files, and it also "
                           f"holds {', '.join(others[:4])}: choose another directory")
    for p in ours:
        shutil.rmtree(p) if p.is_dir() else p.unlink()


def parameters(a: ModelArgs) -> tuple[int, int]:
    """(all parameters, those in the embedding and LM head matrices)."""
    h, d = a.hidden_size, a.head_dim
    attn = h * d * (2 * a.num_heads + 2 * a.num_kv_heads)
    layer = attn + 3 * h * a.intermediate_size + 2 * h
    embedding = a.vocab_size * h * (1 if a.tie_word_embeddings else 2)
    return a.num_layers * layer + h + embedding, embedding


def memory_needed(t: ModelArgs, d: ModelArgs, train_embeddings: bool, rows: int, seq_len: int,
                  slots: int, max_len: int, dtype: torch.dtype, chunk: int) -> dict[str, int]:
    """Bytes a training step needs at its peak, by part. The draft trains in float32 with AdamW
    (weights, gradients and two moments for what trains); activations are those autograd keeps
    for the draft's backward (in `dtype`: bf16 under autocast on CUDA, float32 on the CPU), the
    teacher's hidden states, one layer of the teacher's forward, and one chunk of both models'
    log-probabilities (train.kl_loss)."""
    elem = torch.empty((), dtype=dtype).element_size()
    total_t, _ = parameters(t)
    total_d, emb_d = parameters(d)
    trainable = total_d - (0 if train_embeddings else emb_d)
    tokens = rows * seq_len
    per_layer = tokens * (8 * d.hidden_size + 4 * d.intermediate_size) * elem \
        + rows * d.num_heads * seq_len * seq_len * 4          # attention weights (math SDPA)
    teacher = tokens * t.hidden_size * elem + tokens * (
        3 * t.intermediate_size + (t.num_heads + 2 * t.num_kv_heads) * t.head_dim) * elem
    return {
        "target weights": total_t * elem,
        "target KV pool": KVCache.bytes_needed(t.num_layers, slots, max_len, t.num_kv_heads,
                                               t.head_dim, dtype),
        "draft training state": total_d * 4 + trainable * 12,
        "activations": d.num_layers * per_layer + teacher + chunk * d.vocab_size * 4 * 5,
    }


def memory(parts: dict[str, int], device: torch.device, rows: int, seq_len: int) -> None:
    need, free = sum(parts.values()), free_memory(device)
    if need > free:
        detail = ", ".join(f"{k} {v / 2**30:.2f}" for k, v in parts.items())
        raise DistillError(f"--batch {rows} x --seq-len {seq_len} needs about "
                           f"{need / 2**30:.2f} GiB ({detail}), only {free / 2**30:.2f} GiB free "
                           f"on {device}: lower --batch or --seq-len")
