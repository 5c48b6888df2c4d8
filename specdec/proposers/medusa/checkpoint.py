"""Medusa-1 heads on disk, FasterDecoding's layout: config.json (config.py) beside
medusa_lm_head.safetensors, whose names are the heads' nn.ModuleList state dict:

    {i}.{j}.linear.weight  [H, H]    head i's residual block j < L
    {i}.{j}.linear.bias    [H]
    {i}.{L}.weight         [V, H]    head i's LM head

Safetensors only: the published heads were first released as medusa_lm_head.pt, a pickle, which
loading could run code from; those are refused with the command that converts them once.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from ...runtime.config import CheckpointError, ModelArgs
from ...runtime.model import on_meta
from .config import MedusaArgs, medusa_args, read_medusa_config
from .head import MedusaHead

WEIGHTS = "medusa_lm_head.safetensors"
PICKLE = "medusa_lm_head.pt"


def load_medusa(path: str | Path, target: ModelArgs, dtype: torch.dtype,
                device: torch.device | str) -> MedusaHead:
    """The heads at `path` for a target of shape `target`, in `dtype` on `device`."""
    path = Path(path)
    m = medusa_args(read_medusa_config(path), target, f"{path}/config.json")
    file = weights_file(path)
    try:
        state = load_file(str(file), device=str(device))
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{file}: cannot be read: {e}") from None
    _check_tensors(state, m, file)
    with on_meta():
        head = MedusaHead(m)
    head.heads.load_state_dict({k: v.to(dtype) for k, v in state.items()}, assign=True)
    return head.eval().requires_grad_(False)


def weights_file(path: Path) -> Path:
    file = path / WEIGHTS
    if file.is_file():
        return file
    if (path / PICKLE).is_file():
        raise CheckpointError(
            f"{path / PICKLE}: Medusa heads in pickle format are refused: loading pickle can run "
            f"code. Convert them to safetensors once, on a machine you trust: python -c \"import "
            f"torch; from safetensors.torch import save_file; save_file({{k: v.clone() for k, v "
            f"in torch.load('{path / PICKLE}', map_location='cpu').items()}}, "
            f"'{path / WEIGHTS}')\"")
    raise CheckpointError(f"{path}: no {WEIGHTS} (Medusa heads' weights are read from it)")


def _check_tensors(state: dict[str, torch.Tensor], m: MedusaArgs, file: Path) -> None:
    """Refuse, naming the tensor, weights that config.json or the target does not imply."""
    shapes = expected_shapes(m)
    missing = [n for n in shapes if n not in state]
    unexpected = sorted(set(state) - set(shapes))
    if unexpected:
        heads = 1 + max((int(n.split(".")[0]) for n in state if n.split(".")[0].isdigit()),
                        default=-1)
        layers = 1 + max((int(n.split(".")[1]) for n in state
                          if n.endswith(".linear.weight") and n.split(".")[1].isdigit()),
                         default=-1)
        raise CheckpointError(
            f"{file}: unexpected tensors {unexpected[:5]}: the file holds {heads} heads of "
            f"{layers} blocks, config.json's medusa_num_heads {m.num_heads} and "
            f"medusa_num_layers {m.num_layers} imply {len(shapes)} tensors")
    if missing:
        raise CheckpointError(f"{file}: missing tensors {missing[:5]} that config.json's "
                              f"medusa_num_heads {m.num_heads} and medusa_num_layers "
                              f"{m.num_layers} imply")
    for name, want in shapes.items():
        have = tuple(state[name].shape)
        if have == want:
            continue
        if name.endswith(f".{m.num_layers}.weight") and have[1:] == want[1:]:
            raise CheckpointError(f"{file}: {name} has shape {have}: vocabulary {have[0]} does "
                                  f"not fit the target's vocab_size {m.vocab_size}")
        raise CheckpointError(f"{file}: {name} has shape {have}: hidden size {have[-1]} does "
                              f"not fit the target's hidden_size {m.hidden_size} "
                              f"(expected {want})")


def expected_shapes(m: MedusaArgs) -> dict[str, tuple[int, ...]]:
    h, out = m.hidden_size, {}
    for i in range(m.num_heads):
        for j in range(m.num_layers):
            out[f"{i}.{j}.linear.weight"] = (h, h)
            out[f"{i}.{j}.linear.bias"] = (h,)
        out[f"{i}.{m.num_layers}.weight"] = (m.vocab_size, h)
    return out


def save_medusa(head: MedusaHead, path: str | Path, base_model: str,
                dtype: torch.dtype | None = None) -> None:
    """Write `head` in FasterDecoding's layout (what TGI and Medusa's own loader read):
    config.json and medusa_lm_head.safetensors, its tensors in `dtype` (default: as they are).
    base_model: what the heads draft for (the target's path or name)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    m = head.args
    state = {n: t.detach().to("cpu", dtype).contiguous()
             for n, t in head.heads.state_dict().items()}
    save_file(state, str(path / WEIGHTS))
    config = {"medusa_num_heads": m.num_heads, "medusa_num_layers": m.num_layers,
              "base_model_name_or_path": base_model, "hidden_size": m.hidden_size,
              "vocab_size": m.vocab_size,
              "torch_dtype": str(dtype or head.heads[0][-1].weight.dtype).removeprefix("torch.")}
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
