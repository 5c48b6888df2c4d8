"""Load a local Hugging Face checkpoint directory into `Transformer`. Nothing is downloaded."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from .config import CheckpointError, ModelArgs
from .model import Transformer, rope_frequencies

# Buffers some older checkpoints carry that this implementation recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


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
        raise CheckpointError(f"{path}: no *.safetensors weights (only safetensors are loaded)")
    return files


def load_model(path: str | Path, dtype: torch.dtype, device: torch.device | str) -> Transformer:
    """Build the model on the meta device and assign the checkpoint's tensors: one copy in memory."""
    path = Path(path)
    args = ModelArgs.from_dir(path)
    with torch.device("meta"):
        model = Transformer(args)
    state = {}
    for file in safetensors_files(path):
        try:
            state.update(load_file(str(file), device=str(device)))
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{file}: cannot be read: {e}") from None
    state = {k: v.to(dtype) for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
    expected = set(model.state_dict())
    if args.tie_word_embeddings:
        expected.discard("lm_head.weight")
        state.pop("lm_head.weight", None)
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not match config.json: missing {sorted(missing)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}")
    for name, tensor in state.items():
        want = model.get_parameter(name).shape
        if tensor.shape != want:
            raise CheckpointError(f"{path}: {name} has shape {tuple(tensor.shape)}, "
                                  f"config.json implies {tuple(want)}")
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.inv_freq = rope_frequencies(args).to(device)  # a buffer left on meta by the build
    return model.eval().requires_grad_(False)

