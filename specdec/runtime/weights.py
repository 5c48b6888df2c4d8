"""Load a local Hugging Face checkpoint directory into `Transformer`. Nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .config import CheckpointError, ModelArgs
from .model import FUSED, Transformer, on_meta, rope_table

# Buffers some older checkpoints carry that this implementation recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Pickle formats: loading one can run any code the file carries. Never loaded.
_PICKLE_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as e:
            raise CheckpointError(f"{index}: cannot be read: {e}") from None
        files = [path / s for s in shards]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index}: shard files missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for pattern in _PICKLE_PATTERNS for p in path.glob(pattern))
        if pickles:
            raise CheckpointError(
                f"{path}: weights in pickle format ({', '.join(pickles[:3])}) are refused: loading "
                f"pickle can run code. Convert them to safetensors once, on a machine you trust: "
                f"python -c \"from transformers import AutoModelForCausalLM as M; "
                f"M.from_pretrained('{path}').save_pretrained('{path}-safetensors')\" "
                f"(then copy the tokenizer files beside them)")
        raise CheckpointError(f"{path}: no *.safetensors weights (only safetensors are loaded)")
    return files


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device | str) -> Transformer:
    """Build the model on the meta device and assign the checkpoint's tensors: one copy in
    memory."""
    path = Path(path)
    args = ModelArgs.from_dir(path)
    with on_meta():
        model = Transformer(args)
    state = {}
    for file in safetensors_files(path):
        try:
            state.update(load_file(str(file), device=str(device)))
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{file}: cannot be read: {e}") from None
    state = {k: v.to(dtype) for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
    names = list(model.state_dict())
    expected = set(names if args.fused_checkpoint else _checkpoint_names(names))
    if args.tie_word_embeddings:
        expected.discard("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}")
    if not args.fused_checkpoint:   # Phi-3 stores qkv_proj and gate_up_proj as they are here
        state = _fuse(state, args, path)
    for name, tensor in state.items():
        want = model.get_parameter(name).shape
        if tensor.shape != want:
            raise CheckpointError(f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                  f"config.json implies {tuple(want)}")
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.inv_freq = rope_table(args).to(device)  # a buffer left on meta by the build
    return model.eval().requires_grad_(False)


def _checkpoint_names(names) -> list[str]:
    """The model's parameter names as a Hugging Face checkpoint spells them (FUSED split)."""
    out = []
    for name in names:
        for fused, parts in FUSED.items():
            if f".{fused}." in name:
                out += [name.replace(f".{fused}.", f".{part}.") for part in parts]
                break
        else:
            out.append(name)
    return out


def _fuse(state: dict[str, torch.Tensor], args: ModelArgs, path: Path) -> dict[str, torch.Tensor]:
    """`state` (all names present) with each FUSED group concatenated under the model's name.
    The parts' shapes are checked first: a concatenation would hide which part is wrong."""
    d = args.head_dim
    rows = {"self_attn.q_proj": args.num_heads * d, "self_attn.k_proj": args.num_kv_heads * d,
            "self_attn.v_proj": args.num_kv_heads * d, "mlp.gate_proj": args.intermediate_size,
            "mlp.up_proj": args.intermediate_size}
    for layer in range(args.num_layers):
        for fused, parts in FUSED.items():
            for suffix in ("weight", "bias"):
                names = [f"model.layers.{layer}.{part}.{suffix}" for part in parts]
                if names[0] not in state:
                    continue  # no bias
                for name, part in zip(names, parts):
                    want = (rows[part], args.hidden_size)[: 2 if suffix == "weight" else 1]
                    if tuple(state[name].shape) != want:
                        raise CheckpointError(f"{path}: {name} has shape "
                                              f"{tuple(state[name].shape)}, config.json implies "
                                              f"{want}")
                state[f"model.layers.{layer}.{fused}.{suffix}"] = torch.cat(
                    [state.pop(name) for name in names])
    return state
