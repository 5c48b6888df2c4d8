"""The head's work inside a target verification: catch up on the newly committed positions,
then draft the next round's tokens.

After the target has verified row b (its forward covered tokens + drafts from position start_b;
m_b drafts accepted; x_b the target's own next token), the committed positions now cached are
start_b .. N_b - 1 with N_b = start_b + len(tokens_b) + m_b. The head caches one pair per
committed position (not the rejected drafts'): (the target's features there, the token one
further), the last pair's token being x_b. Its output at position N_b - 1 drafts d_1; step j
feeds (its previous output, d_j) at position N_b - 1 + j. Positions past N_b - 1 hold drafted
pairs, masked by the slot's length until overwritten, exactly as the target's cache.

A row that drafts nothing this round (its policy has the head off) leaves its pairs waiting
(Waiting) instead of running the head: they are written with its next drafting round's, or
once DEFER_MAX of them wait, in one forward. The head reads its cache only when it drafts, so
it drafts from the same pairs either way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...runtime.draft_steps import StepRows, draft_steps
from ...runtime.graphs import GraphedForward
from ...runtime.in_target import InTargetDrafter, Verified
from ...kernels.cpu.linear import pack_model
from ...runtime.batch import Batch
from ...runtime.kv_cache import KVCache
from ...runtime.sampling import BatchSampling
from .head import EagleHead

# Positions a row's pairs may wait. A head forward over a position or two each round, drafting
# nothing, cost an off head a third of target-only's tokens a second on the CPU pair.
DEFER_MAX = 64


@dataclass
class Waiting:
    """A row's pairs not yet in the head's cache, from position `start` on, by verification."""
    start: int
    tokens: list[torch.Tensor] = field(default_factory=list)     # [n_i] pair tokens
    features: list[torch.Tensor] = field(default_factory=list)   # [n_i, A * D] the target's
    n: int = 0

    def add(self, tokens: torch.Tensor, features: torch.Tensor) -> None:
        self.tokens.append(tokens)
        self.features.append(features)
        self.n += len(tokens)


class HeadDrafter(InTargetDrafter):
    reads_every_verification = True

    def __init__(self, head: EagleHead):
        """Drafts once bound to the target's engine (Engine's `head`), which sizes its cache."""
        self.head, self.capture = head, head.args.aux_layers
        self.graphs: GraphedForward | None = None   # graphed() sets them
        self.waiting: dict[int, Waiting] = {}

    def bind(self, engine) -> None:
        a, cache = self.head.args.layer, engine.cache
        self.head.flash = engine.model.flash
        if engine.cpu_kernel:   # its layers on the CPU's kernels, as the target's
            pack_model(self.head)
        self.dtype, self.device, self.vocab_size = engine.dtype, engine.device, engine.vocab_size
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

    def behind(self, seq_id: int) -> int:
        w = self.waiting.get(seq_id)
        return w.n if w else 0

    def release(self, seq_id: int) -> None:
        self.waiting.pop(seq_id, None)

    def draft(self, v: Verified) -> tuple[list[list[int]], list[torch.Tensor | None] | None]:
        """Catch up on the committed positions, then draft: v.features [B, T, A * Ht] the
        target's captured layers over its forward, v.tokens [B, T] its tokens."""
        dev, b = self.device, len(v.seq_ids)
        # Only the committed positions: a rejected draft's pair would be masked until
        # overwritten, and on a compute-bound device it costs as much as a kept one.
        need = [e - s for e, s in zip(v.ends, v.starts)]
        last = torch.tensor(need, device=dev) - 1                                      # [B]
        # Pair tokens: one position ahead of the features, x_b at the last committed position.
        ahead = torch.cat((v.tokens[:, 1:], v.tokens[:, :1]), 1).scatter(
            1, last[:, None], v.nxt[:, None])                                          # [B, T]
        run = []
        for i, seq in enumerate(v.seq_ids):
            w = self.waiting.get(seq)
            if w is not None and w.start + w.n != v.starts[i]:   # not where this one starts
                del self.waiting[seq]
                w = None
            if v.ks[i] or (w.n if w else 0) + need[i] >= DEFER_MAX:
                run.append(i)
                continue
            if w is None:
                w = self.waiting[seq] = Waiting(v.starts[i])
            # Views: the engine gathered v.features out of the forward's output (a CUDA
            # graph's, overwritten by its next replay), and `ahead` is this call's own.
            w.add(ahead[i, :need[i]], v.features[i, :need[i]])
        if not run:
            return [[] for _ in range(b)], None
        waited = [self.waiting.pop(v.seq_ids[i], None) for i in run]
        if len(run) == b and not any(waited):
            return self._draft(ahead, v.features, v.starts, need, v.slots, v.ks, v.ends,
                               v.sampling)
        rows, feats, starts = [], [], []
        for i, w in zip(run, waited):
            new = (ahead[i, :need[i]], v.features[i, :need[i]])
            rows.append(torch.cat(w.tokens + [new[0]]) if w else new[0])
            feats.append(torch.cat(w.features + [new[1]]) if w else new[1])
            starts.append(w.start if w else v.starts[i])
        n = [len(r) for r in rows]
        tokens = ahead.new_zeros(len(run), max(n))                                   # [R, t]
        features = v.features.new_zeros(len(run), max(n), v.features.shape[-1])     # [R, t, AD]
        for j, (r, f) in enumerate(zip(rows, feats)):
            tokens[j, :len(r)], features[j, :len(f)] = r, f
        drafted, q = self._draft(tokens, features, starts, n, [v.slots[i] for i in run],
                                 [v.ks[i] for i in run], [v.ends[i] for i in run],
                                 BatchSampling.stack([v.params[i] for i in run], dev))
        out: list[list[int]] = [[] for _ in range(b)]
        qs: list[torch.Tensor | None] = [None] * b
        for j, i in enumerate(run):
            out[i], qs[i] = drafted[j], None if q is None else q[j]
        return out, None if q is None else qs

    def _draft(self, ahead: torch.Tensor, features: torch.Tensor, starts: list[int],
               need: list[int], slots: list[int], ks: list[int], ends: list[int],
               s: BatchSampling) -> tuple[list[list[int]], torch.Tensor | None]:
        """Write every row's pairs into its slot (ahead [B, t] from position starts[b], need[b]
        of them, with their features [B, t, A * Ht]), then draft ks[b] from each row's last,
        committed up to ends[b]."""
        head, dev = self.head, self.device
        t, b = max(need), len(need)
        last = torch.tensor(need, device=dev) - 1                                      # [B]
        batch = Batch.build(ahead[:, :t], starts, slots, self.cache, dev, need)
        feature = head.fc(features[:, :t].to(self.dtype))                            # [B, t, H]
        h = self._forward(batch, feature)
        h = h[torch.arange(b, device=dev), last][:, None]                             # [B, 1, H]
        steps = StepRows(ks, ends, 1, batch.read_slots, batch.first_slot)
        return draft_steps(steps, h, s, self.cache,
                           lambda x: head.target_ids(head.logits(x).argmax(-1)),
                           lambda x: head.target_logits(x, self.vocab_size), self._forward)
