"""Where each token of a ragged batch goes: rows of a forward, each appending its tokens at its
own positions into its own KV slot (model.py's forward and attention.py's plan read it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv_cache import KVCache
from .transfer import to_device


def rows_from(hidden: torch.Tensor, first: list[int], n: int) -> torch.Tensor:
    """Each row's n hidden states from index first[b] on, [B, n, D] (past a row's end: its last
    index, whose result the caller ignores)."""
    base = to_device(first, hidden.device)
    idx = (base[:, None] + torch.arange(n, device=hidden.device)).clamp(max=hidden.shape[1] - 1)
    return hidden.gather(1, idx[..., None].expand(-1, -1, hidden.shape[-1]))


@dataclass
class Batch:
    """Where each token of a ragged batch goes. Built on the host by `Batch.build`."""
    tokens: torch.Tensor        # [B, T] ids, padding is 0
    positions: torch.Tensor     # [B, T] absolute positions
    write_slots: torch.Tensor   # [B, T] cache slot per token; padding goes to the scratch slot
    read_slots: torch.Tensor    # [B] slot each row attends over
    kv_len: int                 # keys to read: max over rows of (last position + 1)
    last: torch.Tensor          # [B] index of each row's last real token
    first_slot: int | None = None  # rows read slots first_slot.. in order: a view, no gather
    max_end: int = 0            # host bound on a row's first position + T (flash-attn's writes)
    real: torch.Tensor | None = None  # CPU: [N] the real tokens' indices in [B T]; None: all are

    @classmethod
    def build(cls, rows: list[list[int]] | torch.Tensor, starts: list[int], slots: list[int],
              cache: KVCache, device: torch.device, lengths: list[int] | None = None) -> "Batch":
        """Row b appends its first lengths[b] tokens to slot slots[b], from position starts[b].

        rows: token lists (padded here), or a [B, T] device tensor (no host round trip).
        lengths: real tokens per row (default: all); the rest is padding.
        """
        if isinstance(rows, torch.Tensor):
            t_max = rows.shape[1]
            tokens = rows
            n = lengths or [t_max] * len(starts)
        else:
            n = lengths or [len(r) for r in rows]
            t_max = max(len(r) for r in rows)
            tokens = torch.tensor([r + [0] * (t_max - len(r)) for r in rows], dtype=torch.int64)
        start = torch.tensor(starts, dtype=torch.int64)[:, None]
        t = torch.arange(t_max)[None, :]
        real = t < torch.tensor(n)[:, None]
        positions = (start + t).clamp(max=cache.max_len - 1)
        write = torch.where(real, torch.tensor(slots)[:, None], cache.scratch)
        kv_len = min(max(s + max(k, 1) for s, k in zip(starts, n)), cache.max_len)
        consecutive = slots == list(range(slots[0], slots[0] + len(slots)))
        # The CPU's kernels take the real tokens alone (Transformer.forward): a prefill beside
        # one-token rows costs its own tokens, not every row padded to its length.
        flat = device.type == "cpu" and sum(n) < real.numel()
        return cls(tokens.to(device), positions.to(device), write.to(device),
                   torch.tensor(slots).to(device), kv_len,
                   (torch.tensor(n).clamp(min=1) - 1).to(device),
                   slots[0] if consecutive else None,
                   min(max(starts), cache.max_len - 1) + t_max,
                   real.view(-1).nonzero().view(-1) if flat else None)
