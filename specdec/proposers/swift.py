"""SWIFT self-speculation: the target drafts for itself with some of its layers skipped.

Xia et al. 2024, "SWIFT: On-the-Fly Self-Speculative Decoding for LLM Inference Acceleration",
after Zhang et al. 2023, "Draft & Verify: Lossless Large Language Model Acceleration via
Self-Speculative Decoding". The draft is the target's own forward over a subset of its layers:
no weights of its own, no training. Which layers to skip is searched on the user's prompts
(`specdec tune --self`, tune/self_search.py) and named by the setting SPECDEC_SELF_SKIP.

A `SkipView` is the `model` of a second `Engine`: it shares every parameter tensor with the
target and runs only the kept layers, and that engine's KV slot pool holds only those
(KVCache.renumbered: attention still indexes the cache by each layer's own number).

The first and the last layer are never skipped, as in SWIFT's own search (and Draft & Verify's):
layer 0 turns token embeddings into the representation every later layer reads, the last layer
writes what the final norm and LM head read directly; skipping either moves the draft furthest
from the target for the same saving as any middle layer.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ..runtime import attention
from ..runtime.kv_cache import KVCache
from ..runtime.batch import Batch
from ..runtime.model import Transformer

SETTING = "SPECDEC_SELF_SKIP"


def parse_skip(text: str, num_layers: int, name: str = SETTING) -> tuple[int, ...]:
    """'3,5,7-9' -> (3, 5, 7, 8, 9): the layers to skip of a target with num_layers layers,
    sorted. ValueError naming `name` for anything else (see check_skip)."""
    skip: list[int] = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            a, b = int(lo), int(hi) if dash else int(lo)
        except ValueError:
            raise ValueError(f"{name}={text!r}: {part!r} is not a layer index or a range a-b "
                             f"(expected e.g. '3,5,7-9')") from None
        if a > b:
            raise ValueError(f"{name}={text!r}: range {part!r} runs backwards")
        skip.extend(range(a, b + 1))
    check_skip(skip, num_layers, f"{name}={text!r}")
    return tuple(sorted(skip))


def check_skip(skip: Sequence[int], num_layers: int, name: str = SETTING) -> None:
    """Refuse a skip set a target of num_layers layers cannot draft with."""
    if not skip:
        raise ValueError(f"{name}: names no layer (the target with no layer skipped is the "
                         f"target itself)")
    if len(set(skip)) != len(skip):
        twice = next(i for i in skip if list(skip).count(i) > 1)
        raise ValueError(f"{name}: layer {twice} is named twice")
    outside = [i for i in skip if not 0 <= i < num_layers]
    if outside:
        raise ValueError(f"{name}: layer {outside[0]} is out of range: the target has "
                         f"{num_layers} layers, 0..{num_layers - 1}")
    if len(skip) == num_layers:
        raise ValueError(f"{name}: skips all {num_layers} layers")
    ends = sorted({0, num_layers - 1} & set(skip))
    if ends:
        raise ValueError(f"{name}: layer {ends[0]} is never skipped (the first and the last "
                         f"layer are always kept; skippable: 1..{num_layers - 2})")


def format_skip(skip: Sequence[int]) -> str:
    """(3, 5, 7, 8, 9) -> '3,5,7-9': what parse_skip reads."""
    runs: list[list[int]] = []
    for i in sorted(skip):
        if runs and runs[-1][1] == i - 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


class SkipView:
    """The target over its kept layers: usable wherever an Engine takes a Transformer.

    args: the target's with num_layers = the kept layers (the engine sizes its KV pool by it);
    layer_windows still indexed by the target's layer numbers. flash, the batch-invariant
    attention and the CPU's attention kernel are this view's own (its engine sets them); the
    linear layers are the target's modules, blocked or packed as the target's engine made them."""

    def __init__(self, target: Transformer, skip: Sequence[int]):
        n = target.args.num_layers
        if skip:
            check_skip(list(skip), n, "skip set")
        self.target, self.skip = target, tuple(sorted(skip))
        self.kept = tuple(i for i in range(n) if i not in self.skip)
        self.layers = [target.model.layers[i] for i in self.kept]
        self.args = replace(target.args, num_layers=len(self.kept))
        self.lm_head = target.lm_head
        self.windows = tuple(sorted({target.args.window(i) or 0 for i in self.kept}))
        self.flash, self.invariant = target.flash, target.invariant
        self.cpu_attention = target.cpu_attention
        self.capture: tuple[int, ...] = ()   # never a head's features: those are the target's
        self._renumbered: tuple[KVCache | None, KVCache | None] = (None, None)

    def make_batch_invariant(self) -> None:
        self.invariant = True

    def kv_bytes(self, max_sequences: int, max_len: int, dtype: torch.dtype) -> int:
        """Its engine's KV slot pool: the kept layers only."""
        a = self.args
        return KVCache.bytes_needed(len(self.kept), max_sequences, max_len, a.num_kv_heads,
                                    a.head_dim, dtype)

    def __call__(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        return self.forward(batch, cache)

    def forward(self, batch: Batch, cache: KVCache) -> torch.Tensor:
        """Transformer.forward over the kept layers; cache: a pool of (at least) the kept
        layers' count, its j-th layer the j-th kept one. Hidden states [B, T, hidden]."""
        if self._renumbered[0] is not cache:
            self._renumbered = (cache, cache.renumbered(self.kept))
        cache = self._renumbered[1]
        plan = attention.plan(batch, cache, self.windows, self.flash, self.invariant,
                              self.cpu_attention)
        return self.target.run(self.layers, batch, cache, plan)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.logits(hidden)
