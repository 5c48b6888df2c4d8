"""The head's work inside a target verification: catch up on the newly committed positions,
then draft the next round's tokens.

After the target has verified row b (its forward covered tokens + drafts from position start_b;
m_b drafts accepted; x_b the target's own next token), the committed positions now cached are
start_b .. N_b - 1 with N_b = start_b + len(tokens_b) + m_b. The head caches one pair per
committed position (not the rejected drafts'): (the target's features there, the token one
further), the last pair's token being x_b. Its output at position N_b - 1 drafts d_1; step j
feeds (its previous output, d_j) at position N_b - 1 + j. Positions past N_b - 1 hold drafted
pairs, masked by the slot's length until overwritten, exactly as the target's cache.
"""
from __future__ import annotations

import torch

from ...runtime.draft_steps import StepRows, draft_steps
from ...runtime.graphs import GraphedForward
from ...runtime.in_target import InTargetDrafter, Verified
from ...runtime.kv_cache import KVCache
from ...runtime.batch import Batch
from .head import EagleHead


class HeadDrafter(InTargetDrafter):
    reads_every_verification = True

    def __init__(self, head: EagleHead):
        """Drafts once bound to the target's engine (Engine's `head`), which sizes its cache."""
        self.head, self.capture = head, head.args.aux_layers
        self.graphs: GraphedForward | None = None   # graphed() sets them

    def bind(self, engine) -> None:
        a, cache = self.head.args.layer, engine.cache
        self.head.flash = engine.model.flash
        self.device, self.max_len, self.vocab_size = engine.device, cache.max_len, engine.vocab_size
        self.cache = KVCache(1, cache.num_slots, cache.max_len, a.num_kv_heads, a.head_dim,
                             engine.dtype, engine.device)

    def graphed(self, capture: bool = True) -> None:
        """Replay the head's small forwards (its draft steps, short catch-ups) from CUDA graphs,
        as the engine does the target's; the one-row step is captured now (the others by the
        engine's capture_graphs in a server, else as they come)."""
        self.graphs = GraphedForward(self.head, self.cache, self.cache.scratch, capture=capture,
                                     feature_dim=self.head.args.layer.hidden_size)
        self.graphs.warm_up()

    def _forward(self, batch: Batch, feature: torch.Tensor) -> torch.Tensor:
        if self.graphs is not None and self.graphs.fits(batch):
            return self.graphs(batch, feature)
        return self.head(batch, feature, self.cache)

    def bytes_needed(self, max_sequences: int, max_len: int, dtype: torch.dtype) -> int:
        a = self.head.args.layer
        return KVCache.bytes_needed(1, max_sequences, max_len, a.num_kv_heads, a.head_dim, dtype)

    def draft(self, v: Verified) -> tuple[list[list[int]], torch.Tensor | None]:
        """Catch up on the committed positions, then draft: v.features [B, T, A * Ht] the
        target's captured layers over its forward, v.tokens [B, T] its tokens."""
        head, dev = self.head, self.device
        features, rows, starts, slots, ends, nxt, ks, s = (
            v.features, v.tokens, v.starts, v.slots, v.ends, v.nxt, v.ks, v.sampling)
        b = len(v.seq_ids)
        # Only the committed positions: a rejected draft's pair would be masked until
        # overwritten, and on a compute-bound device it costs as much as a kept one.
        need = [e - s for e, s in zip(ends, starts)]
        t = max(need)
        last = torch.tensor(need, device=dev) - 1                                      # [B]
        # Pair tokens: one position ahead of the features, x_b at the last committed position.
        ahead = torch.cat((rows[:, 1:], rows[:, :1]), 1).scatter(1, last[:, None], nxt[:, None])
        batch = Batch.build(ahead[:, :t], starts, slots, self.cache, dev, need)
        feature = head.fc(features[:, :t].to(head.fc.weight.dtype))                  # [B, t, H]
        h = self._forward(batch, feature)
        h = h[torch.arange(b, device=dev), last][:, None]                             # [B, 1, H]
        steps = StepRows(ks, ends, 1, batch.read_slots, batch.first_slot)
        return draft_steps(steps, h, s, self.cache,
                           lambda x: head.target_ids(head.logits(x).argmax(-1)),
                           lambda x: head.target_logits(x, self.vocab_size), self._forward)
