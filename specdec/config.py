"""Architecture of one checkpoint, read once from a local Hugging Face `config.json`.

Covers the Llama family: Llama 2/3 (incl. Llama 3.1 RoPE scaling), Mistral (sliding window),
Qwen2 (q/k/v bias), tied or untied embeddings. Anything else fails here, at load, naming the file.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be served; the message names the file."""


@dataclass(frozen=True)
class ModelArgs:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position: int = 8192
    qkv_bias: bool = False
    o_bias: bool = False
    tie_word_embeddings: bool = False
    sliding_window: int | None = None
    eos_token_ids: tuple[int, ...] = ()

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "ModelArgs":
        model_type = cfg.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(f"{source}: model_type {model_type!r} is not supported "
                                  f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        if cfg.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"{source}: hidden_act {cfg['hidden_act']!r} is not supported")
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            # transformers >= 5 writes `rope_parameters`; older checkpoints `rope_theta`/`rope_scaling`.
            rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
            rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
            rope_type = rope.get("rope_type", rope.get("type", "default"))
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise CheckpointError(f"{source}: rope type {rope_type!r} is not supported "
                                      f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
            bias = bool(cfg.get("attention_bias", False))
            window = cfg.get("sliding_window")
            if model_type == "qwen2" and not cfg.get("use_sliding_window", False):
                window = None
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                max_position_embeddings=int(cfg.get("max_position_embeddings", 2048)),
                rope_theta=rope_theta,
                rope_type=rope_type,
                rope_factor=float(rope.get("factor", 1.0)),
                rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
                rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
                rope_original_max_position=int(rope.get("original_max_position_embeddings", 8192)),
                qkv_bias=bias or model_type == "qwen2",
                o_bias=bias,
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                sliding_window=int(window) if window else None,
                eos_token_ids=eos_ids,
            )
        except KeyError as e:
            raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from None

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelArgs":
        path = Path(path)
        file = path / "config.json"
        if not path.is_dir():
            raise CheckpointError(f"{path}: model directory does not exist")
        if not file.is_file():
            raise CheckpointError(f"{file}: missing (not a Hugging Face checkpoint directory)")
        try:
            cfg = json.loads(file.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{file}: cannot be read: {e}") from None
        args = cls.from_dict(cfg, str(file))
        return _with_generation_eos(args, path / "generation_config.json")


def _with_generation_eos(args: ModelArgs, file: Path) -> ModelArgs:
    """generation_config.json's eos ids win over config.json's (Llama 3 lists several there)."""
    if not file.is_file():
        return args
    try:
        eos = json.loads(file.read_text()).get("eos_token_id")
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: cannot be read: {e}") from None
    if eos is None:
        return args
    ids = tuple(eos) if isinstance(eos, list) else (int(eos),)
    return ModelArgs(**{**args.__dict__, "eos_token_ids": ids})
