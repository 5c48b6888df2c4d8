"""The engine's side of drafting in the target's process: the verification of round r drafts
round r + 1.

This module is the interface the engine calls (InTargetDrafter, with what a verification hands
it, Verified); the drafters are proposers (specdec/proposers/), attached to an engine from
outside. An EAGLE-3 head (proposers/eagle/) and Medusa heads (proposers/medusa/) read the hidden
states of that verification; a draft model placed beside the target (proposers/colocated.py), or
the target itself with layers skipped (SWIFT, proposers/swift.py), reads only the committed
tokens. Either way a round is one call, and a sampled proposal's probabilities never leave the
process: the engine keeps them until the verification that checks the proposal.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..records import Proposal, ProposeCall, SamplingParams, SlotError

if TYPE_CHECKING:
    from .sampling import BatchSampling


class HeadSource(Protocol):
    """A head's checkpoint that Engine.load loads with the target (proposers/eagle/checkpoint.py):
    its drafter reads the target's layers, so it joins the engine before any CUDA graph."""
    path: str

    def load(self, model, dtype: torch.dtype, device: torch.device) -> "InTargetDrafter": ...


class DraftEngine(Protocol):
    """What a co-located draft calls of its engine (engine.Engine, or SWIFT's view of the
    target's): the drafters import the engine's interface, never the engine itself."""

    def propose(self, calls: list[ProposeCall]) -> list[Proposal | SlotError]: ...


@dataclass
class Verified:
    """A verification's rows that draft next, as their drafter sees them (B rows, T the
    forward's length)."""
    seq_ids: list[int]
    starts: list[int]             # the forward's first position per row
    slots: list[int]              # the target's slot per row
    ends: list[int]               # N_b: committed positions the target caches now
    tokens: torch.Tensor          # [B, T] the forward's tokens (committed, then drafts)
    nxt: torch.Tensor             # [B] the target's own token, committed at position N_b
    hidden: torch.Tensor          # [B, D] the final-normed hidden state that scored nxt
    features: torch.Tensor | None  # [B, T, A * D] the captured layers (an EAGLE-3 head's), a
    #                               copy: not the forward's output, which a graph overwrites
    ks: list[int]                 # tokens to draft per row (0: catch up only)
    params: list[SamplingParams]
    sampling: "BatchSampling"     # the same, stacked on the device


class InTargetDrafter:
    capture: tuple[int, ...] = ()   # target layers whose outputs it reads (model.capture)
    graphs = None                   # its own forwards' CUDA graphs (graphs.GraphedForward)
    follows_commits = False         # True: committed() is called for every verified row
    # True: draft() reads every verification of its rows, asked for tokens or not (an EAGLE-3
    # head's cache must hold every position); else a row asking none is not passed to it.
    reads_every_verification = False

    def bind(self, engine) -> None:
        """The engine it drafts in, before that engine's CUDA graphs: a head sizes its own
        cache to the engine's slots here (Engine's `head`)."""

    def graphed(self) -> None:
        """The engine replays its forwards from CUDA graphs: the head replays its own."""

    def bytes_needed(self, max_sequences: int, max_len: int, dtype: torch.dtype) -> int:
        """Device memory bind() will allocate for an engine of that many slots."""
        return 0

    def committed(self, seq_id: int, start: int, tokens: list[int]) -> None:
        """Every verified row, drafting or not: `tokens` are committed from position `start`
        on (the call's tokens, the accepted drafts, the target's own)."""

    def behind(self, seq_id: int) -> int:
        """Committed tokens it reads before drafting for seq_id now (after committed()): none
        for a head, which reads every verification's."""
        return 0

    def draft(self, v: Verified) -> tuple[list[list[int]], Sequence[torch.Tensor | None] | None]:
        """Each row's drafted target ids ([] where it drafts none) and, when any row samples,
        each row's q [>= k_b, V] (a [B, K, V] tensor will do; a greedy row's is unused)."""
        raise NotImplementedError

    def release(self, seq_id: int) -> None:
        pass
