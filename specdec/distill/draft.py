"""The draft's config and first weights, and saving it as a Hugging Face checkpoint directory.

Two starts: N of the target's own decoder layers at its width, with its embeddings, final norm
and LM head (the draft then predicts in the target's own representation from step 0), or a
user's smaller config trained from scratch on the target's vocabulary.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from ..runtime.config import ModelArgs
from ..runtime.weights import safetensors_files
from .checks import DistillError

# Copied from the target: the draft must tokenize and stop exactly as the target does.
TARGET_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "tokenizer.model", "vocab.json", "merges.txt", "added_tokens.json",
                "chat_template.jinja", "chat_template.json", "generation_config.json")


def default_layers(target_layers: int) -> int:
    """An eighth of the target's depth, at least 2 (two layers are the fewest that can copy a
    token seen earlier, induction heads), at most all of them."""
    return min(target_layers, max(2, round(target_layers / 8)))


def layer_indices(target_layers: int, n: int) -> list[int]:
    """n target layers evenly spaced, the first and the last included: on the default target the
    copy of layers {0, 5} agreed with it on 42 % of greedy tokens before training, {0, 1} on 40 %
    and {4, 5} on 1 % (the first layer reads the embeddings, the last writes for the head)."""
    if n == 1:
        return [0]
    return [round(i * (target_layers - 1) / (n - 1)) for i in range(n)]


def layer_copy_config(cfg: dict, idx: list[int]) -> dict:
    out = dict(cfg, num_hidden_layers=len(idx))
    if isinstance(cfg.get("layer_types"), list):   # per-layer attention kinds (Qwen2, Mistral)
        out["layer_types"] = [cfg["layer_types"][i] for i in idx]
    return out


def user_config(target_cfg: dict, target_dir: Path, path: Path) -> dict:
    """The target's config.json overridden by the fields of `path` (a whole config.json or just
    the fields that change); the vocabulary must stay the target's."""
    try:
        user = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise DistillError(f"--draft-config {path}: cannot be read: {e}") from None
    if not isinstance(user, dict):
        raise DistillError(f"--draft-config {path}: expected a JSON object of config fields")
    vocab = target_cfg["vocab_size"]
    if user.get("vocab_size", vocab) != vocab:
        raise DistillError(f"--draft-config {path}: vocab_size {user['vocab_size']} differs from "
                           f"the target's {vocab} ({target_dir / 'config.json'}): the draft must "
                           f"use the target's vocabulary")
    out = {**target_cfg, **user}
    if {"hidden_size", "num_attention_heads"} & user.keys() and "head_dim" not in user:
        out.pop("head_dim", None)          # else the target's head_dim would survive
    if "num_hidden_layers" in user and "layer_types" not in user:
        out.pop("layer_types", None)       # recomputed by transformers for the new depth
    ModelArgs.from_dict(out, f"--draft-config {path}")   # an unsupported layout fails here
    return out


def build(cfg: dict, target_dir: Path, idx: list[int] | None, seed: int) -> torch.nn.Module:
    """A float32 transformers model for `cfg`: random (idx None), or the target's layers idx."""
    from transformers import AutoConfig, AutoModelForCausalLM

    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    config = AutoConfig.for_model(cfg["model_type"], **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if idx is not None:
        state = _target_tensors(target_dir, idx, bool(cfg.get("tie_word_embeddings")))
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = set(missing) - {"lm_head.weight"} if config.tie_word_embeddings else missing
        if missing or unexpected:
            raise DistillError(f"{target_dir}: layer copy does not fit the draft: missing "
                               f"{sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
        model.tie_weights()
    return model


def _target_tensors(path: Path, idx: list[int], tied: bool) -> dict[str, torch.Tensor]:
    """Embeddings, final norm, LM head and layers idx (renumbered 0..) of the target, read
    tensor by tensor: a big target's other layers are never loaded."""
    rename = {f"model.layers.{j}.": f"model.layers.{i}." for i, j in enumerate(idx)}
    state = {}
    for file in safetensors_files(path):
        with safe_open(str(file), "pt") as f:
            for name in f.keys():
                if name.startswith("model.layers."):
                    prefix = ".".join(name.split(".")[:3]) + "."
                    if prefix in rename:
                        state[rename[prefix] + name[len(prefix):]] = f.get_tensor(name).float()
                elif not name.endswith("rotary_emb.inv_freq") and not (
                        tied and name == "lm_head.weight"):
                    state[name] = f.get_tensor(name).float()
    return state


def freeze_embeddings(model: torch.nn.Module) -> None:
    """The target's embeddings and head stay as they are: the draft keeps the target's output
    space, and for big vocabularies they are most of the optimizer state saved."""
    model.get_input_embeddings().weight.requires_grad_(False)
    model.get_output_embeddings().weight.requires_grad_(False)


def save(model: torch.nn.Module, target_dir: Path, out: Path, dtype: torch.dtype) -> None:
    """A standard checkpoint directory: config.json, model.safetensors in `dtype`, and the
    target's tokenizer files and generation_config.json. The model itself is not changed."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model.save_pretrained(out, state_dict=state)
    config = json.loads((out / "config.json").read_text())   # it records the model's float32
    config["dtype"] = str(dtype).removeprefix("torch.")
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in TARGET_FILES:
        if (target_dir / name).is_file():
            shutil.copy2(target_dir / name, out / name)
    for f in out.iterdir():   # readable by a server running as another user
        if f.is_file():
            f.chmod(0o644)


def save_dtype(cfg: dict) -> torch.dtype:
    """The target's own storage dtype (bfloat16 when config.json does not say)."""
    name = cfg.get("dtype") or cfg.get("torch_dtype") or "bfloat16"
    return {"float32": torch.float32, "float16": torch.float16}.get(name, torch.bfloat16)
