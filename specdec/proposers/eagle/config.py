"""An EAGLE-3 head's architecture, read once from its local `config.json`, in either published
format, and checked against the target it will serve.

- EAGLE / SpecForge (`"architectures": ["LlamaForCausalLMEagle3"]`): a Llama config of one layer
  plus `draft_vocab_size`, optional `target_hidden_size` and optional
  `eagle_config.eagle_aux_hidden_state_layer_ids`; weights `midlayer.*`.
- speculators (`"speculators_model_type": "eagle3"`): the layer's Llama config under
  `transformer_layer_config`, with `draft_vocab_size`, `norm_before_residual`,
  `target_hidden_size` and optional `eagle_aux_hidden_state_layer_ids` at the top; weights
  `layers.0.*`.

Auxiliary layers are kept here as the indices of the target layers whose outputs are fused
(0-based; the output of layer i is the residual stream entering layer i + 1). The formats count
differently: SpecForge's ids name a layer's output (SGLang adds 1), the speculators' ids the
layer the stream enters (as vLLM reads them). Without ids both mean EAGLE-3's choice: the
streams entering layers 2, L // 2 and L - 3.

Defaults where config.json is silent follow vLLM's reading: `norm_before_residual` false in the
EAGLE format, true in the speculators one; RoPE theta 10000 (the EAGLE trainer's, whatever the
target's).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ...runtime.config import CheckpointError, ModelArgs, read_config_json

EAGLE_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS = "speculators"
EAGLE = "eagle"


@dataclass(frozen=True)
class HeadArgs:
    layer: ModelArgs                # the head's decoder layer; vocab_size: its embedding rows
    draft_vocab_size: int           # rows of lm_head
    target_hidden_size: int         # each fused feature's size
    aux_layers: tuple[int, ...]     # target layers whose outputs are fused, in fc's order
    norm_before_residual: bool = False
    format: str = EAGLE             # EAGLE or SPECULATORS: the weights' names


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """EAGLE-3's choice (inputs of layers 2, L // 2, L - 3) as layer outputs."""
    return (1, num_layers // 2 - 1, num_layers - 4)


def read_head_config(path: str | Path) -> dict:
    return read_config_json(
        path, "an EAGLE-3 head directory has config.json and safetensors weights")


def head_args(cfg: dict, target: ModelArgs, source: str = "config.json") -> HeadArgs:
    """The head's HeadArgs from its config.json, refused (naming the field) where it does not
    fit `target` or is a variant this implementation does not serve."""
    if cfg.get("speculators_model_type") is not None:
        kind = cfg["speculators_model_type"]
        if kind != "eagle3":
            raise CheckpointError(f"{source}: speculators_model_type {kind!r} is not served "
                                  f"(only eagle3)")
        layer_cfg = cfg.get("transformer_layer_config")
        if not isinstance(layer_cfg, dict):
            raise CheckpointError(f"{source}: transformer_layer_config is missing")
        fmt, top = SPECULATORS, cfg
        _refuse_variants(cfg, {"norm_before_fc": False, "fc_norm": False,
                               "norm_output": False}, source)
    elif set(cfg.get("architectures") or ()) & set(EAGLE_ARCHITECTURES):
        fmt, layer_cfg, top = EAGLE, cfg, {**cfg, **(cfg.get("eagle_config") or {})}
        _refuse_variants(top, {"norm_before_fc": False, "fc_norm": False, "norm_output": True},
                         source)
    else:
        raise CheckpointError(
            f"{source}: not an EAGLE-3 head: expected \"speculators_model_type\": \"eagle3\" or "
            f"architectures {list(EAGLE_ARCHITECTURES)}, have architectures "
            f"{cfg.get('architectures')}")
    layer_cfg = {"model_type": "llama", **layer_cfg}
    if layer_cfg["model_type"] != "llama":
        raise CheckpointError(f"{source}: the head's layer model_type "
                              f"{layer_cfg['model_type']!r} is not served (only llama)")
    layers = layer_cfg.get("num_hidden_layers", 1)
    if layers != 1:
        raise CheckpointError(f"{source}: num_hidden_layers {layers}: only one-layer heads are "
                              f"served")
    if layer_cfg.get("tie_word_embeddings"):
        raise CheckpointError(f"{source}: tie_word_embeddings true: a head's lm_head is over the "
                              f"draft vocabulary, never the embedding")
    layer_cfg = {**layer_cfg, "eos_token_id": None}
    layer = ModelArgs.from_dict(layer_cfg, source)
    draft_vocab = top.get("draft_vocab_size") or layer.vocab_size
    target_hidden = top.get("target_hidden_size") or layer.hidden_size
    ids = top.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        aux = default_aux_layers(target.num_layers)
        if not aux[0] < aux[1] < aux[2]:
            raise CheckpointError(
                f"{source}: no eagle_aux_hidden_state_layer_ids, and EAGLE-3's default (the "
                f"streams entering layers 2, L // 2 and L - 3) needs a target of 8 layers or "
                f"more, not {target.num_layers}: name the layers")
    else:   # speculators: the layer the stream enters
        aux = tuple(int(i) - (fmt == SPECULATORS) for i in ids)
    h = HeadArgs(replace(layer, num_layers=1), int(draft_vocab), int(target_hidden), aux,
                 bool(top.get("norm_before_residual", fmt == SPECULATORS)), fmt)
    _check_fits(h, target, source)
    return h


def _refuse_variants(cfg: dict, implemented: dict, source: str) -> None:
    """Options of newer trainers that change the forward: served only at these values."""
    for name, value in implemented.items():
        if name in cfg and cfg[name] is not None and bool(cfg[name]) != value:
            raise CheckpointError(f"{source}: {name} {cfg[name]!r} is not served (only "
                                  f"{str(value).lower()})")


def aux_layer_ids(h: HeadArgs) -> list[int]:
    """h.aux_layers as the format's config.json counts them."""
    return [i + (h.format == SPECULATORS) for i in h.aux_layers]


def _check_fits(h: HeadArgs, target: ModelArgs, source: str) -> None:
    if h.target_hidden_size != target.hidden_size:
        field = "target_hidden_size" if h.target_hidden_size != h.layer.hidden_size \
            else "hidden_size"
        raise CheckpointError(f"{source}: {field} {h.target_hidden_size} does not fit the "
                              f"target's hidden_size {target.hidden_size}")
    if h.layer.vocab_size != target.vocab_size:
        raise CheckpointError(f"{source}: vocab_size {h.layer.vocab_size} does not fit the "
                              f"target's vocab_size {target.vocab_size}")
    if not 1 <= h.draft_vocab_size <= target.vocab_size:
        raise CheckpointError(f"{source}: draft_vocab_size {h.draft_vocab_size} must be within "
                              f"1..{target.vocab_size} (the target's vocab_size)")
    if len(h.aux_layers) != 3:
        raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids "
                              f"{list(h.aux_layers)}: EAGLE-3 fuses three layers")
    if not all(0 <= i < target.num_layers for i in h.aux_layers):
        raise CheckpointError(f"{source}: eagle_aux_hidden_state_layer_ids {aux_layer_ids(h)} "
                              f"do not name layers of the target's {target.num_layers}")
