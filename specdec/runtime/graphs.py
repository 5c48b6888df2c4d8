"""The model's forward for small batches, replayed from CUDA graphs.

A 1B draft step or an 8B verification at batch 1 is bound by launching hundreds of small
kernels from Python, not by the GPU; a graph replays them with one launch. One graph per
(batch bucket, tokens per row): a server captures every one at load (warm_up(every=True)),
elsewhere each is captured the first time its shape comes. Rows are padded up to
the bucket with rows that read and write the scratch slot, and a graph never depends on this
call's lengths: SDPA attends over max_len keys under the mask, flash-attn reads each row's
length from a device tensor. Prefills (more than `max_tokens` tokens per row) run eagerly.

The EAGLE-3 head's forwards (eagle/drafting.py) go through the same class with `feature_dim`:
they read a feature per token ([B, T, feature_dim]: the target's fused features or the head's
own previous output) beside the tokens, one more static input.

`capture=False` runs the same padded, static-shape forward eagerly: how the CPU tests check that
this path gives the eager path's tokens.
"""
from __future__ import annotations

import time
import torch

from .kv_cache import KVCache
from .batch import Batch
from .model import Transformer

BUCKETS = (1, 2, 4, 8, 16, 32, 64)


class _Static:
    """A graph's input buffers: rows past `used` are padding on the scratch slot."""

    def __init__(self, b: int, t: int, cache: KVCache, device: torch.device,
                 feature: tuple[int, torch.dtype] | None):
        self.tokens = torch.zeros(b, t, dtype=torch.int64, device=device)
        # [b, t, dim]: the head's feature input; padding rows keep whatever was there
        self.feature = None if feature is None else torch.zeros(
            b, t, feature[0], dtype=feature[1], device=device)
        self.positions = torch.zeros(b, t, dtype=torch.int64, device=device)
        self.write = torch.full((b, t), cache.scratch, dtype=torch.int64, device=device)
        self.read = torch.full((b,), cache.scratch, dtype=torch.int64, device=device)
        self.batch = Batch(self.tokens, self.positions, self.write, self.read, cache.max_len,
                           torch.zeros(b, dtype=torch.int64, device=device), None, cache.max_len)
        self.used = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None   # [b, t, hidden], rewritten by every replay

    def fill(self, batch: Batch, scratch: int, feature: torch.Tensor | None) -> None:
        n = batch.tokens.shape[0]
        self.tokens[:n].copy_(batch.tokens)
        if feature is not None:
            self.feature[:n].copy_(feature)
        self.positions[:n].copy_(batch.positions)
        self.write[:n].copy_(batch.write_slots)
        self.read[:n].copy_(batch.read_slots)
        if self.used > n:  # rows a larger call filled go back to padding
            self.tokens[n:self.used].zero_()
            self.positions[n:self.used].zero_()
            self.write[n:self.used].fill_(scratch)
            self.read[n:self.used].fill_(scratch)
        self.used = n


class GraphedForward:
    def __init__(self, model: Transformer | torch.nn.Module, cache: KVCache, max_batch: int,
                 max_tokens: int = 16, capture: bool = True, feature_dim: int = 0):
        """model: the target or draft (forward(batch, cache)), or an EAGLE-3 head with
        feature_dim its hidden size (forward(batch, feature, cache))."""
        self.model, self.cache, self.max_tokens = model, cache, max_tokens
        self.buckets = sorted({min(b, max_batch) for b in BUCKETS})
        self.capture = capture
        self.device = cache.k[0].device
        self.feature = (feature_dim, cache.k[0].dtype) if feature_dim else None
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.graphs: dict[tuple[int, int], _Static] = {}
        self.warm_s = 0.0   # seconds warm_up took

    @torch.inference_mode()
    def warm_up(self, every: bool = False) -> None:
        """Capture the one-row, one-token graph now, so that a forward that cannot be captured
        fails the load (set cuda_graphs = false) instead of every request; every: all the
        graphs a call can replay, (bucket, 1..max_tokens tokens) per bucket. A capture runs a
        few forwards, and the first time a row count comes the exact mode's kernels compile:
        met while serving, it stalls every row of the batch (on the H200, 53 of 403 py-spy
        samples of a warmed-up served run were captures, a co-located draft's catch-ups of
        lengths not seen before)."""
        t0 = time.perf_counter()
        shapes = [(b, t) for b in self.buckets for t in range(1, self.max_tokens + 1)] \
            if every else [(1, 1)]
        for key in shapes:
            if key not in self.graphs:
                g = self.graphs[key] = _Static(*key, self.cache, self.device, self.feature)
                if self.capture:
                    self._capture(g)
        self.warm_s += time.perf_counter() - t0

    def fits(self, batch: Batch) -> bool:
        b, t = batch.tokens.shape
        return (b <= self.buckets[-1] and t <= self.max_tokens
                and (self.model.flash is None or batch.max_end <= self.cache.max_len))

    def __call__(self, batch: Batch, feature: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [B, T, hidden]: a view of the graph's output, valid until its next call.
        feature [B, T, feature_dim]: the head's feature input (only with feature_dim)."""
        b, t = batch.tokens.shape
        key = (next(n for n in self.buckets if n >= b), t)
        g = self.graphs.get(key)
        if g is None:
            g = self.graphs[key] = _Static(*key, self.cache, self.device, self.feature)
            if self.capture:
                self._capture(g)
        g.fill(batch, self.cache.scratch, feature)
        if g.graph is None:
            return self._run(g)[:b]
        g.graph.replay()
        return g.out[:b]

    def _run(self, g: _Static) -> torch.Tensor:
        if g.feature is None:
            return self.model(g.batch, self.cache)
        return self.model(g.batch, g.feature, self.cache)

    def _capture(self, g: _Static) -> None:
        # Warm up on a side stream (kernel choice, workspaces), then capture; the rows are all
        # padding here, so only the scratch slot is written.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self._run(g)
        torch.cuda.current_stream(self.device).wait_stream(side)
        g.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g.graph, pool=self.pool):
            g.out = self._run(g)
