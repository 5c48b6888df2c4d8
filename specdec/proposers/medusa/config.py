"""Medusa-1 heads' shape, read once from their local `config.json` (FasterDecoding's
MedusaConfig) and checked against the target they will serve.

    medusa_num_heads          K: head i predicts the token i + 1 positions after the target's
    medusa_num_layers         L: residual blocks per head before its LM head (may be 0)
    base_model_name_or_path   what the heads were trained for (recorded, not loaded)
    hidden_size, vocab_size   optional (trainers that copy the base config write them); the
                              weights' shapes are checked against the target in any case
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...runtime.config import CheckpointError, ModelArgs, read_config_json

MAX_HEADS = 16   # a chain of heads this long never pays; more is a misread config


@dataclass(frozen=True)
class MedusaArgs:
    num_heads: int              # K
    num_layers: int             # L residual blocks per head
    hidden_size: int            # the target's: each block is [H, H], each LM head [V, H]
    vocab_size: int             # the target's
    base_model: str | None = None


def read_medusa_config(path: str | Path) -> dict:
    return read_config_json(
        path, "Medusa heads are a directory of config.json and medusa_lm_head.safetensors")


def medusa_args(cfg: dict, target: ModelArgs, source: str = "config.json") -> MedusaArgs:
    """The heads' MedusaArgs from their config.json, refused (naming the field and both values)
    where it does not fit `target`."""
    if "medusa_num_heads" not in cfg:
        raise CheckpointError(f"{source}: not Medusa heads: no medusa_num_heads (FasterDecoding's "
                              f"layout has medusa_num_heads and medusa_num_layers)")
    heads = _count(cfg, "medusa_num_heads", 1, MAX_HEADS, source)
    layers = _count(cfg, "medusa_num_layers", 0, 64, source, default=1)
    for name, ours in (("hidden_size", target.hidden_size), ("vocab_size", target.vocab_size)):
        if cfg.get(name) is not None and cfg[name] != ours:
            raise CheckpointError(f"{source}: {name} {cfg[name]} does not fit the target's "
                                  f"{name} {ours}")
    return MedusaArgs(heads, layers, target.hidden_size, target.vocab_size,
                      cfg.get("base_model_name_or_path"))


def _count(cfg: dict, name: str, low: int, high: int, source: str, default: int | None = None
           ) -> int:
    value = cfg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CheckpointError(f"{source}: {name} {value!r} must be an integer within "
                              f"{low}..{high}")
    return value
