"""The drafters target_model serves in its own process (specdec/runtime/in_target.py), from
settings.

Each drafts the next round inside a verification, so a round is one BLS call. An EAGLE-3 head
is loaded with the target's weights (Engine.load: it must capture layers before CUDA graphs);
the rest are attached here, after the target has loaded.
"""
from __future__ import annotations

import torch

from ..runtime.config import CheckpointError
from ..runtime.engine import Engine
from ..runtime.memory import free_memory
from ..proposers.colocated import ColocatedDraft
from ..proposers.medusa.checkpoint import load_medusa
from ..proposers.medusa.drafting import MedusaDrafter
from ..records import Proposer
from ..proposers.swift import SkipView, format_skip, parse_skip
from .checks import graphs_line
from .engine_settings import EngineSettings
from .settings import ENV_PREFIX, NO_DRAFT, InTargetSettings, SettingsError, model_paths


def attach(engine: Engine, s: EngineSettings, it: InTargetSettings, params: dict,
           device: torch.device, dtype: torch.dtype) -> list[str]:
    """Attach what `it` asks for to the target's engine; returns a line per drafter for the
    log at start. Refusals raise, failing the load with the setting's name."""
    said = []
    draft = model_paths(params).draft
    if it.draft_in_target and draft != NO_DRAFT:
        # The draft's own slot pool, as long as the target's; its vocabulary cut to the
        # target's, as draft_model's is.
        colocated = Engine.load(draft, s.max_sequences, s.max_seq_len, dtype, device,
                                vocab_size=engine.model.args.vocab_size,
                                attention_kind=s.attention,
                                cuda_graphs=s.cuda_graphs and device.type == "cuda",
                                fused_pointwise=s.fused_pointwise)
        engine.add_drafter(Proposer.DRAFT, ColocatedDraft(colocated))
        colocated.capture_graphs()
        said.append(f"draft model {draft} in target_model's process on {device} "
                    f"(draft_placement {it.draft_placement})"
                    + (f", {graphs_line(colocated)}" if colocated.graphs is not None else ""))
    if it.medusa_heads_path:
        # Refused by field where they do not fit the target (medusa/checkpoint.py); the heads
        # in the target's dtype, reading its final hidden state.
        try:
            heads = load_medusa(it.medusa_heads_path, engine.model.args, dtype, device)
        except CheckpointError as e:
            raise SettingsError(f"medusa_heads_path ({ENV_PREFIX}MEDUSA_HEADS): {e}") from None
        engine.add_drafter(Proposer.MEDUSA, MedusaDrafter(heads, engine.vocab_size))
        said.append(f"{heads.args.num_heads} Medusa-1 heads {it.medusa_heads_path} in "
                    f"target_model's process on {device}")
    if it.self_skip:
        said.append(_attach_self(engine, s, it.self_skip, device, dtype))
    return said


def _attach_self(engine: Engine, s: EngineSettings, text: str, device: torch.device,
                 dtype: torch.dtype) -> str:
    """SWIFT (swift.py): the target's own layers less the skip set, drafting from a slot pool of
    the kept layers alone, as long as the target's."""
    name = f"self_skip ({ENV_PREFIX}SELF_SKIP)"
    if s.tensor_parallel > 1:
        # The skipped view runs the target's own sharded layers: their all_reduce needs every
        # rank, and the drafters run on rank 0 alone.
        raise SettingsError(f"{name}: not served at tensor_parallel ({ENV_PREFIX}TENSOR_PARALLEL)"
                            f" {s.tensor_parallel}: the target drafts for itself at degree 1 only")
    n = engine.model.args.num_layers
    try:
        view = SkipView(engine.model, parse_skip(text, n, name))
    except ValueError as e:
        raise SettingsError(str(e)) from None
    need, free = view.kv_bytes(s.max_sequences, s.max_seq_len, dtype), free_memory(device)
    if need > free:
        raise SettingsError(f"{name}: its KV slot pool of {len(view.kept)} layers x "
                            f"{s.max_sequences} sequences x {s.max_seq_len} tokens needs "
                            f"{need / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free on {device}")
    drafting = Engine(view, s.max_sequences, s.max_seq_len, device,
                      vocab_size=engine.vocab_size, attention_kind=s.attention,
                      cuda_graphs=s.cuda_graphs and device.type == "cuda")
    engine.add_drafter(Proposer.SELF, ColocatedDraft(drafting))
    drafting.capture_graphs()
    return (f"the target drafting for itself (SWIFT) in target_model's process on {device}: "
            f"layers {format_skip(view.skip)} skipped, {len(view.kept)} of {n} kept, KV "
            f"{need / 2**20:.0f} MiB"
            + (f", {graphs_line(drafting)}" if drafting.graphs is not None else ""))
