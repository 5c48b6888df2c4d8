"""One model with its KV slot pool: the draft's `propose` and the target's `verify`.

Both take a batch of calls from different sequences. Each call names its sequence, the cached
length to roll back to (`start`) and the committed tokens the model has not cached yet; the
caller, not the engine, knows what was accepted, so a model never needs a separate rollback
call. Errors are per call (SlotError in that call's place); the other calls still run.
"""
from __future__ import annotations

import time
from dataclasses import replace

import torch

from ..kernels.cpu import (attention as cpu_attention, build as cpu_build, linear as cpu_linear,
                           pointwise as cpu_pointwise)
from ..records import Failure, Proposal, ProposeCall, Proposer, SlotError, Verdict, VerifyCall
from . import attention, gpu_pointwise, memory
from .batch import Batch, rows_from
from .config import CheckpointError
from .draft_steps import StepRows, draft_steps
from .graphs import GraphedForward
from .in_target import HeadSource, InTargetDrafter, Verified
from .kv_cache import KVCache, SlotPool
from .logprobs import scored
from .model import Transformer
from .parallel_drafts import ParallelDrafts
from .sampling import BatchSampling, apply_token_masks, probabilities
from .transfer import to_device
from .verify import verify as verify_drafts, verify_greedy
from .weights import load_model


class Engine:
    def __init__(self, model: Transformer, max_sequences: int, max_len: int,
                 device: torch.device, vocab_size: int | None = None,
                 attention_kind: str = "auto", cuda_graphs: bool | None = None,
                 head: InTargetDrafter | None = None, batch_invariant: bool = False,
                 cpu_kernel: bool | None = None, fused_pointwise: bool = False):
        """attention_kind: auto, sdpa or flash (attention.choose). cuda_graphs: replay small
        forwards (the head's too) from CUDA graphs (graphs.py); None = on CUDA. head: a drafter
        reading the target's layers inside verify (an EAGLE-3 head's, proposers/eagle/),
        attached before any CUDA graph. batch_invariant: score each token with the same
        arithmetic whatever its batch holds (invariant.py). cpu_kernel: the CPU's own kernels
        (kernels/cpu/; None: on the CPU in float32 and bfloat16 where they build; True:
        required), which fuse the layers' norms and MLP there. fused_pointwise: on CUDA, those by
        gpu_pointwise.py's Triton kernels where its probe passes. Load errors raise ValueError."""
        a = model.args
        self.model, self.device, self.max_len = model, device, max_len
        self.dtype = model.lm_head.weight.dtype
        self.cache = KVCache(a.num_layers, max_sequences, max_len, a.num_kv_heads, a.head_dim,
                             self.dtype, device)
        model.flash = attention.choose(attention_kind, device, self.dtype)
        self.cpu_kernel = _pack_for_cpu(model, device, self.dtype, cpu_kernel)
        self.fused_pointwise = (fused_pointwise and device.type == "cuda"
                                and gpu_pointwise.attach(model) is None)
        if batch_invariant:
            model.make_batch_invariant()
        # A draft serving another model's vocabulary drafts only ids the target has, and is fed
        # ids it lacks (a target with more rows) as id 0: acceptance may suffer, output never.
        self.vocab_size = min(vocab_size or a.vocab_size, a.vocab_size)
        self.accepts_ids_below = max(vocab_size or a.vocab_size, a.vocab_size)
        # Drafters in this process (in_target.py): the verification of round r drafts round
        # r + 1. The q of each sequence's sampled proposal waits here for its verification.
        self.drafters: dict[Proposer, InTargetDrafter] = {}
        self.q: dict[int, torch.Tensor] = {}
        # A PARD checkpoint proposes k tokens in one pass (parallel_drafts.py).
        self.parallel = None if a.pard_token is None else ParallelDrafts(a.pard_token)
        self.head = None
        if head is not None:   # before any CUDA graph: capture changes forward's output
            head.bind(self)
            self.head = head
            self.add_drafter(Proposer.EAGLE, head)
        if cuda_graphs is None:
            cuda_graphs = device.type == "cuda"
        if cuda_graphs and device.type != "cuda":
            raise ValueError(f"cuda_graphs needs a CUDA device, not {device.type}")
        self.graphs = None
        if cuda_graphs:
            self.graphs = GraphedForward(model, self.cache, max_sequences)
            self.graphs.warm_up()
            if self.head is not None:
                self.head.graphed()
        self.pool = SlotPool(max_sequences)

    @property
    def graphed_forwards(self) -> list[GraphedForward]:
        """Its forwards replayed from CUDA graphs: its own and its head's (none on a CPU)."""
        head = self.head.graphs if self.head is not None else None
        return [g for g in (self.graphs, head) if g is not None]

    def capture_graphs(self) -> None:
        """Every CUDA graph its calls (and its head's) can replay, captured now: a server's, so
        that no request meets a capture (graphs.py)."""
        for g in self.graphed_forwards:
            g.warm_up(every=True)

    def add_drafter(self, kind: Proposer, drafter: InTargetDrafter) -> None:
        """One that reads captured layers comes before any CUDA graph (the constructor's head)."""
        if drafter.capture:
            if getattr(self, "graphs", None) is not None or self.model.capture:
                raise ValueError(f"{kind}: a drafter reading the target's layers is added "
                                 f"before CUDA graphs, and only one")
            self.model.capture = drafter.capture
        self.drafters[kind] = drafter

    @classmethod
    def load(cls, path: str, max_sequences: int, max_len: int, dtype: torch.dtype,
             device: torch.device, vocab_size: int | None = None, attention_kind: str = "auto",
             cuda_graphs: bool | None = None, head: HeadSource | None = None,
             batch_invariant: bool = False, tp=None,
             cpu_kernel: bool | None = None, fused_pointwise: bool = False) -> "Engine":
        """Load weights (and a head's: proposers/eagle/checkpoint.HeadCheckpoint) and allocate the
        slot pool; refuse loudly if the pool cannot fit. tp: this rank's parallel.Shard (its slices
        of the weights, its KV heads: the memory check is per rank)."""
        memory.check_fits(path, max_sequences, max_len, dtype, device, tp)
        if tp is None:
            model = load_model(path, dtype, device)
        else:   # an EAGLE-3 head drafts on rank 0 alone (parallel_engine.Leader)
            head = head if tp.rank == 0 else None
            from .tensor_parallel.sharded_weights import load_shard
            model = load_shard(path, dtype, device, tp, head.path if head else None)
        a = model.args
        if max_len > a.max_position_embeddings:
            raise CheckpointError(f"{path}/config.json: max_seq_len {max_len} exceeds "
                                  f"max_position_embeddings {a.max_position_embeddings}")
        drafter = head.load(model, dtype, device) if head else None
        need = KVCache.bytes_needed(a.num_layers, max_sequences, max_len, a.num_kv_heads,
                                    a.head_dim, dtype)
        if drafter is not None:
            need += drafter.bytes_needed(max_sequences, max_len, dtype)
        free = memory.free_memory(device)
        if need > free:
            raise CheckpointError(
                f"{path}: KV slot pool of {max_sequences} sequences x {max_len} tokens needs "
                f"{need / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free on {device}: "
                f"lower max_sequences or max_seq_len")
        return cls(model, max_sequences, max_len, device, vocab_size, attention_kind, cuda_graphs,
                   drafter, batch_invariant, cpu_kernel, fused_pointwise)

    def _forward(self, batch: Batch) -> torch.Tensor:
        if self.graphs is not None and self.graphs.fits(batch):
            return self.graphs(batch)
        return self.model(batch, self.cache)

    def _open(self, calls, extra: list[int]) -> tuple[list[int], list, list[int]]:
        """Open each call's slot; returns (slots of good calls, results with errors, good idx)."""
        results: list = [None] * len(calls)
        slots, good = [], []
        seen = set()
        for i, (c, more) in enumerate(zip(calls, extra)):
            try:
                if c.seq_id in seen:
                    raise SlotError(f"sequence {c.seq_id} appears twice in one batch")
                if not c.tokens:
                    raise SlotError(f"sequence {c.seq_id}: no tokens to append")
                if more < 0:
                    raise SlotError(f"sequence {c.seq_id}: nothing to draft")
                end = c.start + len(c.tokens) + more
                if end > self.max_len:
                    raise SlotError(f"sequence {c.seq_id}: {end} tokens exceed max_seq_len "
                                    f"{self.max_len}")
                if min(c.tokens) < 0 or max(c.tokens) >= self.accepts_ids_below:
                    raise SlotError(f"sequence {c.seq_id}: token id out of range")
                slots.append(self.pool.open(c.seq_id, c.start))
                seen.add(c.seq_id)
                good.append(i)
            except SlotError as e:
                results[i] = e
        return slots, results, good

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.logits(hidden)[..., : self.vocab_size]

    @torch.inference_mode()
    def propose(self, calls: list[ProposeCall]) -> list[Proposal | SlotError]:
        if self.parallel is not None:
            return self.parallel.propose(self, calls)
        slots, results, good = self._open(calls, [c.k - 1 for c in calls])
        if not good:
            return results
        cs = [calls[i] for i in good]
        starts = [c.start for c in cs]
        ks = [c.k for c in cs]
        first = [c.start + len(c.tokens) for c in cs]                      # position of d_1
        s = BatchSampling.stack([c.sampling for c in cs], self.device)
        v_own = self.model.args.vocab_size
        batch = Batch.build([[t if t < v_own else 0 for t in c.tokens] for c in cs], starts, slots,
                            self.cache, self.device)
        hidden = self._forward(batch)
        rows = torch.arange(len(cs), device=self.device)
        logits = self._logits(hidden[rows, batch.last])[:, None]           # [B, 1, V]
        steps = StepRows(ks, first, 0, batch.read_slots, batch.first_slot)
        tokens, q = draft_steps(steps, logits, s, self.cache, lambda x: x.argmax(-1),
                                lambda x: x, lambda b, _: self._logits(self._forward(b)))
        for b, (i, c) in enumerate(zip(good, cs)):
            self.pool.set_length(c.seq_id, first[b] + c.k - 1)
            results[i] = Proposal(tokens[b], None if c.sampling.greedy else q[b, : c.k])
        return results

    @torch.inference_mode()
    def verify(self, calls: list[VerifyCall]) -> list[Verdict | SlotError]:
        if self.drafters:
            calls = [self.with_kept_q(c) for c in calls]
        slots, results, good = self._open(calls, [len(c.drafts) for c in calls])
        if not good:
            return results
        cs = [calls[i] for i in good]
        ks = [len(c.drafts) for c in cs]
        k_max = max(ks)
        batch = Batch.build([c.tokens + c.drafts for c in cs], [c.start for c in cs], slots,
                            self.cache, self.device)
        hidden = self._forward(batch)                                      # [B, T, D (+ A D)]
        d = self.model.args.hidden_size
        features = hidden[..., d:] if self.model.capture else None        # [B, T, A D]
        hidden = full = hidden[..., :d]
        # Score the last committed token and every draft: K+1 positions per row.
        hidden = rows_from(hidden, [len(c.tokens) - 1 for c in cs], k_max + 1)
        s = BatchSampling.stack([c.sampling for c in cs], self.device)
        logits = self._logits(hidden)                                      # [B, K+1, V]
        if any(c.masks is not None for c in cs):   # a grammar's: the target's choice within it
            logits = apply_token_masks(logits, [c.masks for c in cs])
        drafts = to_device([c.drafts + [0] * (k_max - len(c.drafts)) for c in cs], self.device)
        num_drafts = to_device(ks, self.device)
        if s.all_greedy:
            accepted_t, nxt_t = verify_greedy(logits, drafts, num_drafts)
        else:
            q = self._draft_probs(cs, drafts, k_max)
            first = to_device([c.start + len(c.tokens) for c in cs], self.device)
            accepted_t, nxt_t = verify_drafts(probabilities(logits, s), q, drafts, num_drafts, s,
                                              first)
        accepted, nxt = accepted_t.tolist(), nxt_t.tolist()                # the one sync
        tokens = [c.drafts[:m] + [t] for c, m, t in zip(cs, accepted, nxt)]
        followers = [d for d in self.drafters.values() if d.follows_commits]
        for c, m, new in zip(cs, accepted, tokens):
            self.pool.set_length(c.seq_id, c.start + len(c.tokens) + m)
            for drafter in followers:   # before any drafts: they draft from what is committed
                drafter.committed(c.seq_id, c.start, c.tokens + new)
        ahead: dict[int, dict] = {}
        asked = {kind: [b for b, c in enumerate(cs) if c.next_by == kind and c.next_k is not None
                        and (c.next_k or drafter.reads_every_verification)]
                 for kind, drafter in self.drafters.items()}
        if any(asked.values()):
            scored = hidden[torch.arange(len(cs), device=self.device), accepted_t]    # [B, D]
            ahead = self._draft_next(asked, cs, accepted, scored, features, batch, slots,
                                     nxt_t)
        for b, (i, c, m, new) in enumerate(zip(good, cs, accepted, tokens)):
            results[i] = Verdict(new, m, batch_k=k_max, **ahead.get(b, {}),
                                 **self._logprobs(c, new, logits[b], full[b]))
        return results

    def _logprobs(self, c: VerifyCall, new: list[int], logits: torch.Tensor,
                  hidden: torch.Tensor) -> dict:
        """The verdict's logprob fields a call asked for: its committed tokens' from the rows
        that scored them (logits [K+1, V]), its prompt's from every prompt row (hidden [T, D])."""
        out = {}
        if c.logprobs is not None:
            out["logprobs"] = scored(logits[:len(new)], new, c.sampling, c.logprobs)
        if c.prompt_logprobs is not None and c.start == 0:
            rows = self._logits(hidden[:len(c.tokens) - 1])                  # [L-1, V]
            out["prompt_logprobs"] = scored(rows, c.tokens[1:], c.sampling, c.prompt_logprobs)
        return out

    def _draft_probs(self, cs: list[VerifyCall], drafts: torch.Tensor,
                     k_max: int) -> torch.Tensor | None:
        """q [B, K, V] for verify, or None where no call sent its draft's probabilities."""
        if all(c.draft_probs is None for c in cs):
            return None
        v = self.vocab_size
        q = torch.zeros(len(cs), k_max, v, device=self.device)
        # Copies of materialized rows, no compute per row; a call without q gets the one-hot
        # rows that verify assumes when q is None, so both paths accept and correct alike.
        for b, c in enumerate(cs):
            k = len(c.drafts)
            if c.draft_probs is not None and k:
                w = min(v, c.draft_probs.shape[-1])
                q[b, :k, :w] = c.draft_probs[:, :w].to(self.device, torch.float32,
                                                       non_blocking=True)
            elif k:
                q[b, :k] = torch.nn.functional.one_hot(drafts[b, :k], v).float()
        return q

    def with_kept_q(self, c: VerifyCall) -> VerifyCall:
        """A proposal drafted here is verified with the q it was drawn from (kept here); a
        sampled one whose q is gone (the engine restarted) is not verified at all: one-hot would
        not be exact for it."""
        q = self.q.pop(c.seq_id, None)
        if not c.drafts_in_target or c.sampling.greedy or not c.drafts:
            return c
        if q is None or len(q) < len(c.drafts):
            return replace(c, drafts=[], draft_probs=None)
        return replace(c, draft_probs=q[: len(c.drafts)])

    def _draft_next(self, asked: dict[Proposer, list[int]], cs: list[VerifyCall],
                    accepted: list[int], scored: torch.Tensor, features: torch.Tensor | None,
                    batch: Batch, slots: list[int], nxt: torch.Tensor) -> dict[int, dict]:
        """Each in-target drafter's next proposal for the rows that ask it (asked: its rows):
        row -> its verdict's proposal fields. A failure costs the proposal, never the verdict:
        the round's tokens stand."""
        out: dict[int, dict] = {}
        for kind, rows in asked.items():
            if rows:
                out.update(self._draft_with(self.drafters[kind], rows, cs, accepted, scored,
                                            features, batch, slots, nxt))
        return out

    def _draft_with(self, drafter: InTargetDrafter, rows: list[int], cs: list[VerifyCall],
                    accepted: list[int], scored: torch.Tensor, features: torch.Tensor | None,
                    batch: Batch, slots: list[int], nxt: torch.Tensor) -> dict[int, dict]:
        t0 = time.perf_counter()
        sub = [cs[b] for b in rows]
        idx = torch.tensor(rows, device=self.device)
        ends = [c.start + len(c.tokens) + accepted[b] for b, c in zip(rows, sub)]
        # Never past the slot: the loop's next limit is below max_len - (end + 1) anyway.
        ks = [max(0, min(c.next_k, self.max_len - e - 1)) for c, e in zip(sub, ends)]
        fed = max((drafter.behind(c.seq_id) for c, k in zip(sub, ks) if k), default=0)
        params = [c.sampling for c in sub]
        try:
            proposals, q = drafter.draft(Verified(
                [c.seq_id for c in sub], [c.start for c in sub], [slots[b] for b in rows], ends,
                batch.tokens[idx], nxt[idx], scored[idx],
                None if features is None else features[idx], ks, params,
                BatchSampling.stack(params, self.device)))
            failure = None
        except Exception:   # a drafter is an accelerator: this round drafts nothing
            proposals, q, failure = [[] for _ in sub], None, Failure.ERROR
        seconds = time.perf_counter() - t0
        out = {}
        for j, (b, c, tokens) in enumerate(zip(rows, sub, proposals)):
            out[b] = dict(proposal=tokens, draft_s=seconds, failure=failure, steps=max(ks),
                          fed=fed)
            row_q = None if q is None else q[j]
            if row_q is not None and tokens and not c.sampling.greedy:
                self.q[c.seq_id] = row_q[: len(tokens)]
        return out

    def release(self, seq_ids: list[int]) -> None:
        for seq_id in seq_ids:
            self.pool.release(seq_id)
            self.q.pop(seq_id, None)
            if self.parallel is not None:
                self.parallel.release(seq_id)
            for drafter in self.drafters.values():
                drafter.release(seq_id)


def _pack_for_cpu(model: Transformer, device: torch.device, dtype: torch.dtype,
                  wanted: bool | None) -> bool:
    """Whether model's linear layers now run the CPU's kernels (see Engine)."""
    usable = device.type == "cpu" and dtype in cpu_linear.DTYPES
    if wanted is False or (wanted is None and not usable):
        return False
    if not usable:
        raise ValueError(f"cpu_kernel needs the CPU in float32 or bfloat16, not {device.type} "
                         f"{str(dtype).removeprefix('torch.')}")
    if cpu_build.load() is None:
        if wanted:
            raise ValueError(f"cpu_kernel: {cpu_build.reason()}")
        return False
    a = model.args
    model.cpu_attention = cpu_attention.usable(a.num_heads, a.num_kv_heads, a.head_dim, dtype)
    if isinstance(model, Transformer):   # swift's SkipView shares the target's modules
        model.fuse_pointwise(cpu_pointwise)
    return cpu_linear.pack_model(model) > 0


def default_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 on CUDA; float32 on the CPU, whose bf16 kernels are slow at small batch."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32
