"""Architecture of one checkpoint, read once from a local Hugging Face `config.json`.

Families (`model_type`): llama (Llama 2, 3, 3.1, 3.2), mistral, qwen2, qwen3 (dense), gemma2,
gemma3_text (Gemma 3's text-only checkpoints), phi3 (Phi-3, Phi-3.5, Phi-4-mini). Every field
that changes the forward is read here, with the default transformers gives it when config.json
leaves it out; a field or value this decoder does not implement fails here, at load, naming the
field and the file.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# config.json's activation name -> ours
ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
LAYER_TYPES = ("full_attention", "sliding_attention")
GEMMA = ("gemma2", "gemma3_text")

# transformers' defaults for the fields config.json may leave out (its config classes, 5.x).
_DEFAULTS = {
    "llama": dict(rms_norm_eps=1e-6, max_position_embeddings=2048, rope_theta=10000.0),
    "mistral": dict(rms_norm_eps=1e-6, max_position_embeddings=131072, rope_theta=10000.0,
                    sliding_window=4096),
    "qwen2": dict(rms_norm_eps=1e-6, max_position_embeddings=32768, rope_theta=10000.0,
                  sliding_window=4096, max_window_layers=28),
    "qwen3": dict(rms_norm_eps=1e-6, max_position_embeddings=32768, rope_theta=10000.0,
                  sliding_window=4096, max_window_layers=28, head_dim=128),
    "gemma2": dict(rms_norm_eps=1e-6, max_position_embeddings=8192, rope_theta=10000.0,
                   sliding_window=4096, head_dim=256, query_pre_attn_scalar=256,
                   final_logit_softcapping=30.0, attn_logit_softcapping=50.0,
                   tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh"),
    "gemma3_text": dict(rms_norm_eps=1e-6, max_position_embeddings=131072, rope_theta=1e6,
                        rope_local_base_freq=10000.0, sliding_window=4096, head_dim=256,
                        query_pre_attn_scalar=256, sliding_window_pattern=6,
                        tie_word_embeddings=True, hidden_activation="gelu_pytorch_tanh"),
    "phi3": dict(rms_norm_eps=1e-5, max_position_embeddings=4096, rope_theta=10000.0),
}
# Fields that must keep the value this decoder implements: (field, allowed values).
_REFUSED = (("mlp_bias", (None, False)), ("use_bidirectional_attention", (None, False)),
            ("quantization_config", (None,)))


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be served; the message names the file."""


@dataclass(frozen=True)
class Rope:
    """One rotary embedding: inverse frequencies theta^(-2i/d), scaled by `type`, and
    `attention_factor` multiplying cos and sin (yarn, longrope)."""
    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0          # llama3
    high_freq_factor: float = 4.0         # llama3
    original_max_position: int = 8192     # llama3, yarn, longrope
    beta_fast: float = 32.0               # yarn
    beta_slow: float = 1.0                # yarn
    truncate: bool = True                 # yarn
    short_factor: tuple[float, ...] = ()  # longrope: positions below original_max_position
    long_factor: tuple[float, ...] = ()   # longrope: positions from original_max_position on
    attention_factor: float = 1.0


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
    rope: Rope = Rope()
    local_rope: Rope | None = None         # sliding-window layers' own RoPE (Gemma 3)
    rotary_dim: int = 0                    # leading dims of a head that rotate; 0: all
    qkv_bias: bool = False
    o_bias: bool = False
    tie_word_embeddings: bool = False
    layer_windows: tuple[int | None, ...] = ()   # per layer: sliding window, None: global
    eos_token_ids: tuple[int, ...] = ()
    model_type: str = "llama"
    qk_norm: bool = False                  # RMSNorm over each head's q and k (Qwen3, Gemma 3)
    gemma_norms: bool = False              # x (1 + w) in float32; norms after attention and MLP
    embed_scale: bool = False              # embeddings x sqrt(hidden_size) (Gemma)
    activation: str = "silu"
    attn_scale: float = 0.0                # query scale; 0: head_dim ** -0.5
    attn_softcap: float | None = None      # cap * tanh(score / cap) (Gemma 2)
    final_softcap: float | None = None     # the same on the logits (Gemma 2)
    fused_checkpoint: bool = False         # qkv_proj / gate_up_proj stored fused (Phi-3)
    pard_token: int | None = None          # a parallel draft's mask token (parallel_drafts.py)

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def layer_rope(self, layer: int) -> int:
        """0: `rope`; 1: `local_rope` (sliding-window layers, when it is set)."""
        return int(self.local_rope is not None and self.window(layer) is not None)

    @property
    def ropes(self) -> tuple[Rope, ...]:
        """`rope`, and `local_rope` when set: layer_rope's indices."""
        return (self.rope,) if self.local_rope is None else (self.rope, self.local_rope)

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "ModelArgs":
        model_type = cfg.get("model_type")
        if model_type == "gemma3":
            raise CheckpointError(
                f"{source}: model_type 'gemma3' is Gemma 3's image-text checkpoint; serve its "
                f"text-only form (model_type gemma3_text, Gemma3ForCausalLM): the 1B release, or "
                f"the language model saved on its own")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(f"{source}: model_type {model_type!r} is not supported "
                                  f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
        c = {**_DEFAULTS[model_type], **cfg}
        for name, allowed in _REFUSED:
            if cfg.get(name) not in allowed:
                raise CheckpointError(f"{source}: {name} = {cfg[name]!r} is not supported")
        try:
            return _parse(cls, model_type, c, cfg, source)
        except KeyError as e:
            raise CheckpointError(f"{source}: missing field {e.args[0]!r}") from None
        except (TypeError, ValueError) as e:
            if isinstance(e, CheckpointError):
                raise
            raise CheckpointError(f"{source}: {e}") from None

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelArgs":
        path = Path(path)
        file = path / "config.json"
        if not path.is_dir():
            raise CheckpointError(f"{path}: model directory does not exist")
        cfg = read_config_json(path, "not a Hugging Face checkpoint directory")
        args = cls.from_dict(cfg, str(file))
        return _with_generation_eos(args, path / "generation_config.json")


def read_config_json(path: str | Path, what: str) -> dict:
    """A directory's config.json (a model's, a head's); `what` says what the directory must be
    where it has none."""
    file = Path(path) / "config.json"
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{file}: missing ({what})") from None
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: cannot be read: {e}") from None


def _parse(cls, model_type: str, c: dict, raw: dict, source: str) -> ModelArgs:
    gemma = model_type in GEMMA
    act_field = "hidden_activation" if gemma else "hidden_act"
    act = c.get(act_field, "silu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{source}: {act_field} {act!r} is not supported "
                              f"(supported: {', '.join(ACTIVATIONS)})")
    heads, hidden = int(c["num_attention_heads"]), int(c["hidden_size"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    layers = int(c["num_hidden_layers"])
    partial = float(c.get("partial_rotary_factor", _rope_dict(c).get("partial_rotary_factor", 1)))
    rotary_dim = int(head_dim * partial)
    if rotary_dim % 2 or not 0 < rotary_dim <= head_dim:
        raise CheckpointError(f"{source}: partial_rotary_factor {partial} gives {rotary_dim} "
                              f"rotary dimensions of {head_dim}: expected an even number")
    rope, local = _ropes(model_type, c, rotary_dim, source)
    bias = bool(c.get("attention_bias", False))
    eos = c.get("eos_token_id")
    return cls(
        vocab_size=int(c["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(c["intermediate_size"]),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=head_dim,
        rms_norm_eps=float(c["rms_norm_eps"]),
        max_position_embeddings=int(c["max_position_embeddings"]),
        rope=rope,
        local_rope=local,
        rotary_dim=0 if rotary_dim == head_dim else rotary_dim,
        qkv_bias=bias or model_type == "qwen2",
        o_bias=bias,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        layer_windows=_windows(model_type, c, layers, source),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else (
            () if eos is None else (int(eos),)),
        model_type=model_type,
        qk_norm=model_type in ("qwen3", "gemma3_text"),
        gemma_norms=gemma,
        embed_scale=gemma,
        activation=ACTIVATIONS[act],
        attn_scale=float(c["query_pre_attn_scalar"]) ** -0.5 if gemma else 0.0,
        attn_softcap=_cap(c.get("attn_logit_softcapping")) if gemma else None,
        final_softcap=_cap(c.get("final_logit_softcapping")) if gemma else None,
        fused_checkpoint=model_type == "phi3",
        pard_token=_mask_token(c, source),
    )


def _mask_token(c: dict, source: str) -> int | None:
    """A PARD checkpoint's mask token: an id of its own vocabulary the tokenizer never yields."""
    token = c.get("pard_token")
    if token is None:
        return None
    if isinstance(token, bool) or not isinstance(token, int) or not (
            0 <= token < int(c["vocab_size"])):
        raise CheckpointError(f"{source}: pard_token {token!r} is not a token id below "
                              f"vocab_size {c['vocab_size']}")
    return token


def _cap(value) -> float | None:
    return float(value) if value else None


def _windows(model_type: str, c: dict, layers: int, source: str) -> tuple[int | None, ...]:
    """Each layer's sliding window as transformers lays them out (`layer_types` when given)."""
    window = c.get("sliding_window")
    if model_type in ("qwen2", "qwen3") and not c.get("use_sliding_window", False):
        window = None
    if model_type == "llama":
        window = None
    types = raw_types = c.get("layer_types")
    if types is None:
        if model_type in ("qwen2", "qwen3"):
            first = int(c["max_window_layers"])
            types = ["sliding_attention" if window and i >= first else "full_attention"
                     for i in range(layers)]
        elif model_type == "gemma2":
            types = ["sliding_attention" if (i + 1) % 2 else "full_attention"
                     for i in range(layers)]
        elif model_type == "gemma3_text":
            pattern = int(c["sliding_window_pattern"])
            types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                     for i in range(layers)]
        else:   # mistral, phi3: one window for every layer
            types = ["sliding_attention" if window else "full_attention"] * layers
    if not isinstance(types, list) or len(types) != layers:
        raise CheckpointError(f"{source}: layer_types {raw_types!r}: expected a list of "
                              f"{layers} entries (num_hidden_layers)")
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise CheckpointError(f"{source}: layer_types {unknown[0]!r} is not supported "
                              f"(supported: {', '.join(LAYER_TYPES)})")
    if "sliding_attention" in types and not window:
        raise CheckpointError(f"{source}: layer_types has sliding_attention layers but "
                              f"sliding_window is {c.get('sliding_window')!r}")
    out = tuple(int(window) if t == "sliding_attention" else None for t in types)
    return out if any(out) else ()


def _rope_dict(c: dict) -> dict:
    """transformers >= 5 writes `rope_parameters`; older checkpoints `rope_theta`/`rope_scaling`."""
    return dict(c.get("rope_parameters") or c.get("rope_scaling") or {})


def _ropes(model_type: str, c: dict, rotary_dim: int, source: str) -> tuple[Rope, Rope | None]:
    """The RoPE of global layers, and of sliding-window layers where the family has its own."""
    params = _rope_dict(c)
    nested = set(params) & set(LAYER_TYPES)
    if nested:   # one dict per layer type (transformers 5's Gemma 3)
        unknown = set(params) - set(LAYER_TYPES)
        if unknown:
            raise CheckpointError(f"{source}: rope_parameters mixes layer types with "
                                  f"{sorted(unknown)}")
        glob = _rope(dict(params.get("full_attention") or {}), c, rotary_dim, source,
                     c["rope_theta"])
        local = _rope(dict(params.get("sliding_attention") or {}), c, rotary_dim, source,
                      c.get("rope_local_base_freq", c["rope_theta"]))
        return glob, (local if local != glob else None)
    glob = _rope(params, c, rotary_dim, source, c["rope_theta"])
    if model_type == "gemma3_text":   # older config.json: rope_scaling is the global layers'
        local = Rope(theta=float(c["rope_local_base_freq"]))
        return glob, (local if local != glob else None)
    return glob, None


def _rope(p: dict, c: dict, rotary_dim: int, source: str, theta) -> Rope:
    kind = p.get("rope_type", p.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        raise CheckpointError(f"{source}: rope type {kind!r} is not supported "
                              f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})")
    theta = float(p.get("rope_theta", theta))
    if kind == "default":
        return Rope(theta=theta)
    max_pos = int(c["max_position_embeddings"])
    # Phi-3 keeps the pretraining length beside rope_scaling, and it wins there.
    original = int(c.get("original_max_position_embeddings")
                   or p.get("original_max_position_embeddings") or max_pos)
    if kind == "linear":
        return Rope(theta=theta, type=kind, factor=float(p["factor"]))
    if kind == "llama3":
        return Rope(theta=theta, type=kind, factor=float(p["factor"]),
                    low_freq_factor=float(p.get("low_freq_factor", 1.0)),
                    high_freq_factor=float(p.get("high_freq_factor", 4.0)),
                    original_max_position=int(p.get("original_max_position_embeddings",
                                                    original)))
    factor = p.get("factor")
    factor = float(factor) if factor is not None else max_pos / original
    attention = p.get("attention_factor")
    if kind == "yarn":
        if attention is None:
            mscale, all_dim = p.get("mscale"), p.get("mscale_all_dim")
            attention = (_yarn_mscale(factor, mscale) / _yarn_mscale(factor, all_dim)
                         if mscale and all_dim else _yarn_mscale(factor, 1.0))
        return Rope(theta=theta, type=kind, factor=factor, original_max_position=original,
                    beta_fast=float(p.get("beta_fast") or 32), beta_slow=float(
                        p.get("beta_slow") or 1), truncate=bool(p.get("truncate", True)),
                    attention_factor=float(attention))
    # longrope
    short, long = tuple(map(float, p["short_factor"])), tuple(map(float, p["long_factor"]))
    for name, values in (("short_factor", short), ("long_factor", long)):
        if len(values) != rotary_dim // 2:
            raise CheckpointError(f"{source}: rope {name} has {len(values)} values, the rotary "
                                  f"dimensions need {rotary_dim // 2}")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return Rope(theta=theta, type=kind, factor=factor, original_max_position=original,
                short_factor=short, long_factor=long, attention_factor=float(attention))


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


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
    return replace(args, eos_token_ids=ids)
