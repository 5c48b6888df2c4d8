"""A pool of KV-cache slots: many sequences at once, each at its own length.

Layout per layer [num_slots + 1, max_len, kv_heads, head_dim] (flash-attn's paged-free layout,
so `flash_attn_with_kvcache(cache_batch_idx=slots)` can read it in place). The last slot is
scratch: padding tokens of a ragged batch write there, never into a live sequence. A sequence's
length lives on the host; rolling back to an accepted length only lowers that number, because
attention masks every position at or past it and the next write overwrites it.
"""
from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ..records import SlotError


class KVCache:
    def __init__(self, num_layers: int, num_slots: int, max_len: int, kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device):
        shape = (num_slots + 1, max_len, kv_heads, head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.num_slots, self.max_len = num_slots, max_len
        self.scratch = num_slots

    @staticmethod
    def bytes_needed(num_layers: int, num_slots: int, max_len: int, kv_heads: int,
                     head_dim: int, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return 2 * num_layers * (num_slots + 1) * max_len * kv_heads * head_dim * elem

    def renumbered(self, layers: Sequence[int]) -> "KVCache":
        """This pool with its j-th layer read and written as model layer layers[j]: the same
        tensors, for a draft that runs some of a model's layers (swift.py) and whose attention
        indexes the cache by each layer's own number."""
        if len(layers) > len(self.k):
            raise ValueError(f"a pool of {len(self.k)} layers cannot hold {len(layers)}")
        alias = copy.copy(self)
        alias.k = {i: self.k[j] for j, i in enumerate(layers)}
        alias.v = {i: self.v[j] for j, i in enumerate(layers)}
        return alias

    def write(self, layer: int, slots: torch.Tensor, positions: torch.Tensor,
              k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [B, T, kv_heads, head_dim] at (slots [B, T], positions [B, T])."""
        self.k[layer].index_put_((slots, positions), k)
        self.v[layer].index_put_((slots, positions), v)

    def read(self, layer: int, slots: torch.Tensor, length: int,
             first_slot: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, length, kv_heads, head_dim] for slots [B]; when they are first_slot, first_slot + 1,
        ... (always so for one row) a view of the pool instead of a gathered copy."""
        if first_slot is not None:
            rows = slice(first_slot, first_slot + slots.shape[0])
            return self.k[layer][rows, :length], self.v[layer][rows, :length]
        return self.k[layer][slots, :length], self.v[layer][slots, :length]


@dataclass
class SlotPool:
    """Host-side bookkeeping: which slot holds which sequence, and how much of it is cached."""
    num_slots: int
    slots: dict[int, int] = field(default_factory=dict)     # sequence id -> slot
    lengths: dict[int, int] = field(default_factory=dict)   # sequence id -> cached tokens

    def __post_init__(self):
        self._free = list(range(self.num_slots - 1, -1, -1))

    @property
    def active(self) -> int:
        return len(self.slots)

    def open(self, seq_id: int, start: int) -> int:
        """The slot of seq_id, rolled back to `start` cached tokens; start 0 opens a new one."""
        if seq_id in self.slots:
            if start > self.lengths[seq_id]:
                raise SlotError(f"sequence {seq_id}: start position {start} is past its "
                                f"{self.lengths[seq_id]} cached tokens")
            self.lengths[seq_id] = start
            return self.slots[seq_id]
        if start != 0:
            raise SlotError(f"sequence {seq_id} is not open (start position {start} != 0)")
        if not self._free:
            raise SlotError(f"all {self.num_slots} sequence slots are in use", unavailable=True)
        self.slots[seq_id] = self._free.pop()
        self.lengths[seq_id] = 0
        return self.slots[seq_id]

    def set_length(self, seq_id: int, length: int) -> None:
        self.lengths[seq_id] = length

    def release(self, seq_id: int) -> bool:
        slot = self.slots.pop(seq_id, None)
        if slot is None:
            return False
        del self.lengths[seq_id]
        self._free.append(slot)
        return True
