"""EAGLE-3 head checkpoints: load either published format, write the speculators one.

Weights are safetensors only (weights.safetensors_files refuses pickles). A head without its own
`embed_tokens.weight` embeds with the target's (both formats allow leaving it out). `t2d`, the
boolean map from target to draft ids, is derived from `d2t` and not needed here.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ...runtime.config import CheckpointError
from ...runtime.model import FUSED, Transformer, on_meta, rope_table
from ...runtime.weights import safetensors_files
from .config import EAGLE, SPECULATORS, HeadArgs, head_args, read_head_config
from .drafting import HeadDrafter
from .head import EagleHead

# Checkpoint name prefix of the decoder layer, by format; the model's is "layers.0.".
_LAYER_PREFIX = {EAGLE: "midlayer.", SPECULATORS: "layers.0."}
_OPTIONAL = ("embed_tokens.weight", "t2d", "d2t")


def load_head(path: str | Path, target: Transformer, dtype: torch.dtype,
              device: torch.device | str) -> EagleHead:
    """The head at `path` for `target` (loaded), its tensors in `dtype` on `device`."""
    path = Path(path)
    h = head_args(read_head_config(path), target.args, f"{path}/config.json")
    with on_meta():
        head = EagleHead(h)
    state: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        try:
            state.update(load_file(str(file), device=str(device)))
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{file}: cannot be read: {e}") from None
    state = _model_names(state, h, path)
    d2t = state.pop("d2t", None)
    state.pop("t2d", None)
    own_embeddings = "embed_tokens.weight" in state
    expected = {n for n in head.state_dict() if n != "d2t"}
    if not own_embeddings:
        expected.discard("embed_tokens.weight")
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not match config.json: missing "
                              f"{sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")
    for name, tensor in state.items():
        want = head.get_parameter(name).shape
        if tensor.shape != want:
            raise CheckpointError(f"{path}: {_checkpoint_name(name, h)} has shape "
                                  f"{tuple(tensor.shape)}, config.json implies {tuple(want)}")
    head.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if not own_embeddings:
        head.embed_tokens.weight = target.model.embed_tokens.weight
    head.d2t = _offsets(d2t, h, path).to(device)
    head.inv_freq = rope_table(h.layer).to(device)
    return head.eval().requires_grad_(False)


@dataclass(frozen=True)
class HeadCheckpoint:
    """An EAGLE-3 head's directory for Engine.load(head=...), loaded with the target's weights
    and drafting inside its verifications (drafting.HeadDrafter)."""
    path: str

    def load(self, model: Transformer, dtype: torch.dtype, device: torch.device) -> HeadDrafter:
        return HeadDrafter(load_head(self.path, model, dtype, device))


def check_verifier(head_path: str | Path, target_path: str | Path) -> str:
    """Refuse a head whose config.json records a target of other architectures than the served
    one's (speculators_config.verifier.architectures; the EAGLE format records none). Shapes are
    checked by head_args at load. Returns a line naming what the head was trained for."""
    cfg = read_head_config(head_path)
    verifier = (cfg.get("speculators_config") or {}).get("verifier") or {}
    theirs = verifier.get("architectures")
    file = Path(target_path) / "config.json"
    try:
        ours = json.loads(file.read_text()).get("architectures")
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: cannot be read: {e}") from None
    if theirs and ours and list(theirs) != list(ours):
        raise CheckpointError(
            f"{head_path}/config.json: speculators_config.verifier.architectures {list(theirs)} "
            f"is not the target's architectures {list(ours)} ({file}): a head drafts only for "
            f"the model it was trained on")
    name = verifier.get("name_or_path")
    return f"EAGLE-3 head {head_path}" + (f", trained for {name}" if name else "")


def _model_names(state: dict, h: HeadArgs, path: Path) -> dict[str, torch.Tensor]:
    """Checkpoint names -> the head's: the format's layer prefix, q/k/v and gate/up fused."""
    prefix = _LAYER_PREFIX[h.format]
    out = {}
    for name, tensor in state.items():
        out["layers.0." + name[len(prefix):] if name.startswith(prefix) else name] = tensor
    for fused, parts in FUSED.items():
        names = [f"layers.0.{p}.weight" for p in parts]
        if all(n in out for n in names):
            try:
                out[f"layers.0.{fused}.weight"] = torch.cat([out.pop(n) for n in names])
            except RuntimeError as e:
                raise CheckpointError(f"{path}: {prefix}{fused} parts do not fit together: "
                                      f"{e}") from None
    return out


def _checkpoint_name(name: str, h: HeadArgs) -> str:
    return _LAYER_PREFIX[h.format] + name[len("layers.0."):] if name.startswith("layers.0.") \
        else name


def _offsets(d2t: torch.Tensor | None, h: HeadArgs, path: Path) -> torch.Tensor:
    """d2t as int64 offsets (target id = draft id + d2t[draft id]), checked to land in the
    target's vocabulary; absent, the draft vocabulary is the target's first ids."""
    if d2t is None:
        if h.draft_vocab_size != h.layer.vocab_size:
            raise CheckpointError(f"{path}: no d2t tensor, and draft_vocab_size "
                                  f"{h.draft_vocab_size} differs from vocab_size "
                                  f"{h.layer.vocab_size}: the draft ids' target ids are unknown")
        return torch.zeros(h.draft_vocab_size, dtype=torch.int64)
    if tuple(d2t.shape) != (h.draft_vocab_size,):
        raise CheckpointError(f"{path}: d2t has shape {tuple(d2t.shape)}, draft_vocab_size "
                              f"{h.draft_vocab_size} implies ({h.draft_vocab_size},)")
    d2t = d2t.to(torch.int64)
    ids = d2t + torch.arange(h.draft_vocab_size, device=d2t.device)
    if int(ids.min()) < 0 or int(ids.max()) >= h.layer.vocab_size or \
            len(torch.unique(ids)) != len(ids):
        raise CheckpointError(f"{path}: d2t maps draft ids outside the target's vocabulary "
                              f"0..{h.layer.vocab_size - 1}, or two onto one")
    return d2t


def save_speculators(head: EagleHead, path: str | Path, verifier: str,
                     extra_config: dict | None = None, *, dtype: torch.dtype | None = None,
                     embeddings: bool = True, verifier_architectures: list[str] | None = None,
                     speculative_tokens: int = 3) -> None:
    """Write `head` in the speculators format (config.json + model.safetensors): the layer's
    Llama config under transformer_layer_config, weights unfused under layers.0., d2t and t2d.
    verifier: what the head drafts for (the target's path or name), recorded in the config with
    verifier_architectures (the target config's). dtype: the floating tensors' (default: as
    they are). embeddings: False leaves embed_tokens out (the target's; loaders share it).
    speculative_tokens: the proposal length vLLM reads from the config."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    h, a = head.args, head.args.layer
    state = {}
    for name, tensor in head.state_dict().items():
        if name == "embed_tokens.weight" and not embeddings:
            continue
        t = tensor.detach().to("cpu").contiguous()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        fused = next((f for f in FUSED if f".{f}." in name), None)
        if fused is None:
            state[name] = t
            continue
        rows = ([a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim,
                 a.num_kv_heads * a.head_dim] if fused == "self_attn.qkv_proj"
                else [a.intermediate_size] * 2)
        for part, piece in zip(FUSED[fused], t.split(rows)):
            state[name.replace(fused, part)] = piece.contiguous()
    state["d2t"] = head.d2t.to("cpu", torch.int64)
    t2d = torch.zeros(a.vocab_size, dtype=torch.bool)
    t2d[head.d2t.cpu() + torch.arange(h.draft_vocab_size)] = True
    state["t2d"] = t2d
    save_file(state, str(path / "model.safetensors"))
    layer = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": a.hidden_size, "intermediate_size": a.intermediate_size,
        "num_hidden_layers": 1, "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads, "head_dim": a.head_dim,
        "hidden_act": "silu", "rms_norm_eps": a.rms_norm_eps,
        "max_position_embeddings": a.max_position_embeddings, "vocab_size": a.vocab_size,
        "rope_theta": a.rope.theta, "rope_scaling": _rope_scaling(a),
        "attention_bias": a.qkv_bias, "mlp_bias": False, "tie_word_embeddings": False,
    }
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.2.0",
        "transformer_layer_config": layer,
        "draft_vocab_size": h.draft_vocab_size,
        "norm_before_residual": h.norm_before_residual,
        "target_hidden_size": h.target_hidden_size,
        # speculators count the layer the stream enters (config.py)
        "eagle_aux_hidden_state_layer_ids": [i + 1 for i in h.aux_layers],
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": {"name_or_path": verifier,
                         "architectures": verifier_architectures or ["LlamaForCausalLM"]},
        },
        "torch_dtype": str(dtype or head.fc.weight.dtype).removeprefix("torch."),
        **(extra_config or {}),
    }
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def _rope_scaling(a) -> dict | None:
    r = a.rope
    if r.type == "default":
        return None
    if r.type == "llama3":
        return {"rope_type": "llama3", "factor": r.factor, "low_freq_factor": r.low_freq_factor,
                "high_freq_factor": r.high_freq_factor,
                "original_max_position_embeddings": r.original_max_position}
    if r.type == "linear":
        return {"rope_type": "linear", "factor": r.factor}
    raise CheckpointError(f"a head with rope type {r.type!r} cannot be written yet")
