"""The drafters target_model serves in its own process (specdec/in_target.py), from settings.

Each drafts the next round inside a verification, so a round is one BLS call. An EAGLE-3 head
is loaded with the target's weights (Engine.load: it must capture layers before CUDA graphs);
the rest are attached here, after the target has loaded.
"""
from __future__ import annotations

import torch

from ..config import CheckpointError
from ..engine import Engine
from ..in_target import ColocatedDraft
from ..medusa.checkpoint import load_medusa
from ..medusa.drafting import MedusaDrafter
from ..records import Proposer
from .settings import (ENV_PREFIX, NO_DRAFT, EngineSettings, InTargetSettings, SettingsError,
                       model_paths)


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
                                cuda_graphs=s.cuda_graphs and device.type == "cuda")
        engine.add_drafter(Proposer.DRAFT, ColocatedDraft(colocated))
        said.append(f"draft model {draft} in target_model's process on {device} "
                    f"(draft_placement {it.draft_placement})")
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
    return said
