"""Drafters in the target's process: the verification of round r drafts round r + 1.

An EAGLE-3 head (eagle/drafting.py) and Medusa heads (medusa/) read the hidden states of that
verification; a draft model placed beside the target, or the target itself with layers skipped
(SWIFT, swift.py), reads only the committed tokens. Either way a round is one call, and a sampled
proposal's probabilities never leave the process: the engine keeps them until the verification
that checks the proposal.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from .records import Proposal, ProposeCall, SamplingParams, SlotError

if TYPE_CHECKING:
    from .sampling import BatchSampling


class DraftEngine(Protocol):
    """What a co-located draft calls of its engine (engine.Engine, or SWIFT's view of the
    target's): this module is below the engine, which imports it."""

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
    features: torch.Tensor | None  # [B, T, A * D] the captured layers (an EAGLE-3 head's)
    ks: list[int]                 # tokens to draft per row (0: catch up only)
    params: list[SamplingParams]
    sampling: "BatchSampling"     # the same, stacked on the device


class InTargetDrafter:
    capture: tuple[int, ...] = ()   # target layers whose outputs it reads (model.capture)
    follows_commits = False         # True: committed() is called for every verified row
    # True: draft() reads every verification of its rows, asked for tokens or not (an EAGLE-3
    # head's cache must hold every position); else a row asking none is not passed to it.
    reads_every_verification = False

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


class ColocatedDraft(InTargetDrafter):
    """A draft model in the target's process (its own Engine: weights, KV slot pool), or the
    target with layers skipped (swift.py) as that engine's model.

    It follows each sequence's committed tokens from the verifications, and after one drafts
    from where its cache stops being right: the committed tokens it holds, plus those of its own
    last drafts that were accepted."""
    follows_commits = True

    def __init__(self, engine: DraftEngine):
        self.engine = engine
        self.history: dict[int, list[int] | None] = {}   # committed tokens; None: lost
        self.held: dict[int, int] = {}        # committed tokens its cache holds
        self.fed: dict[int, tuple[int, list[int]]] = {}   # drafts it cached from position N

    def committed(self, seq_id: int, start: int, tokens: list[int]) -> None:
        h = self.history.setdefault(seq_id, [])
        if h is None or start > len(h):   # a gap: what the target holds is unknown here
            self.history[seq_id] = None
            return
        del h[start:]
        h.extend(tokens)
        if seq_id in self.fed:   # its last drafts, as far as they were accepted, stay cached
            n, fed = self.fed.pop(seq_id)
            ok = 0
            while ok < len(fed) and n + ok < len(h) and h[n + ok] == fed[ok]:
                ok += 1
            self.held[seq_id] = n + ok
        self.held[seq_id] = min(self.held.get(seq_id, 0), len(h) - 1)

    def behind(self, seq_id: int) -> int:
        h = self.history.get(seq_id)
        return len(h) - self.held.get(seq_id, 0) if h else 0

    def draft(self, v: Verified) -> tuple[list[list[int]], list[torch.Tensor | None]]:
        out: list[list[int]] = [[] for _ in v.seq_ids]
        rows, calls = [], []
        for b, (seq, k) in enumerate(zip(v.seq_ids, v.ks)):
            h = self.history.get(seq)
            if k and h:
                held = self.held.get(seq, 0)
                rows.append(b)
                calls.append(ProposeCall(seq, held, h[held:], k, v.params[b]))
        if not calls:
            return out, None
        q: list[torch.Tensor | None] = [None] * len(v.seq_ids)
        for b, c, p in zip(rows, calls, self.engine.propose(calls)):
            if isinstance(p, SlotError):   # this row drafts nothing; it re-prefills next time
                self.held[c.seq_id] = 0
                continue
            out[b], q[b] = p.tokens, p.probs
            self.held[c.seq_id] = c.start + len(c.tokens)
            self.fed[c.seq_id] = (c.start + len(c.tokens), p.tokens[:-1])
        return out, q

    def release(self, seq_id: int) -> None:
        self.history.pop(seq_id, None)
        self.held.pop(seq_id, None)
        self.fed.pop(seq_id, None)
        self.engine.release([seq_id])
