"""A degree-N engine: rank 0's Engine is the one the loop talks to (`Leader`); every call it
gets goes first to the other ranks (`follow`), and then all ranks run the same Engine method on
the same calls. Every rank holds the full logits after the LM head's all_gather and its slot
pool sees the same calls, so every rank computes the same tokens; rank 0's are returned.

The calls travel as pickled objects over a gloo group on the host (on CUDA too: they are small);
a draft's probabilities [k, V] stay on the device and go over the tensor-parallel group.
"""
from __future__ import annotations

import datetime
from dataclasses import replace

import torch
import torch.distributed as dist

# Workers wait for the next call without end: rank 0 may sit idle for hours. Their lives are
# bound to rank 0's by the parent-death signal instead (parallel_worker).
IDLE = datetime.timedelta(days=365)


class RankFailure(RuntimeError):
    """Another rank is gone or a collective failed: this engine can serve nothing more. The
    request may be retried (unavailable); the message says "is not healthy", as Triton does of
    a dead stub, so that the supervisor (serving/recovery.py) restarts the model."""
    unavailable = True


def control_group():
    """The host-side group that carries calls; every rank must call this, in the same order."""
    return dist.new_group(backend="gloo", timeout=IDLE)


class Leader:
    """Rank 0's Engine with the same methods; the other attributes are the Engine's (read and
    set: the drafters a test makes fail are the engine's)."""

    OWN = ("engine", "control", "workers", "failure")

    def __init__(self, engine, control, workers=()):
        self.engine, self.control, self.workers = engine, control, list(workers)
        self.failure: str | None = None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def __setattr__(self, name, value):
        if name in self.OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.engine, name, value)

    def _send(self, op: str, payload) -> None:
        if self.failure is not None:
            raise RankFailure(self.failure)
        try:
            dead = [w.pid for w in self.workers if w.poll() is not None]
            if dead:
                raise RankFailure(f"tensor-parallel worker process(es) {dead} exited")
            probs = []   # (index of the call, its draft probabilities)
            if op == "verify":
                probs = [(i, c.draft_probs) for i, c in enumerate(payload)
                         if c.draft_probs is not None]
                payload = [replace(c, draft_probs=None) if c.draft_probs is not None else c
                           for c in payload]
            meta = [(i, tuple(p.shape), p.dtype) for i, p in probs]
            dist.broadcast_object_list([op, payload, meta], src=0, group=self.control)
            for _, p in probs:
                dist.broadcast(p.contiguous(), src=0)
        except Exception as e:   # a dead rank: nothing more can be computed
            self.failure = self.failure or f"tensor-parallel engine is not healthy: {e}"
            raise RankFailure(self.failure) from e

    def _run(self, op: str, payload):
        self._send(op, payload)
        try:
            return getattr(self.engine, op)(payload)
        except RuntimeError as e:   # a collective inside the forward
            if "gloo" in str(e).lower() or "nccl" in str(e).lower() or isinstance(
                    e, dist.DistError):
                self.failure = f"tensor-parallel engine is not healthy: {e}"
                raise RankFailure(self.failure) from e
            raise

    def propose(self, calls):
        return self._run("propose", calls)

    def verify(self, calls):
        # In-target drafters (an EAGLE-3 head, ...) run on rank 0 alone, and the q of their
        # sampled proposals waits in its engine: each call goes out as rank 0 verifies it (with
        # that q, or without drafts whose q is gone), so that every rank accepts the same
        # drafts; rank 0's engine finds nothing more to take.
        if self.engine.drafters:
            calls = [replace(self.engine.with_kept_q(c), drafts_in_target=False)
                     for c in calls]
        return self._run("verify", calls)

    def release(self, seq_ids):
        return self._run("release", list(seq_ids))

    @property
    def healthy(self) -> bool:
        return self.failure is None and all(w.poll() is None for w in self.workers)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Tell the other ranks to exit, then wait for (or kill) their processes."""
        if self.failure is None:
            try:
                dist.broadcast_object_list(["stop", None, []], src=0, group=self.control)
            except Exception:
                pass
        for w in self.workers:
            try:
                w.wait(timeout_s)
            except Exception:
                w.kill()


def follow(engine, control, device: torch.device) -> None:
    """Ranks > 0: run each call rank 0 sends until it says stop."""
    while True:
        message = [None, None, None]
        dist.broadcast_object_list(message, src=0, group=control)
        op, payload, meta = message
        if op == "stop":
            return
        for i, shape, dtype in meta:   # in the order rank 0 sent them
            p = torch.empty(shape, dtype=dtype, device=device)
            dist.broadcast(p, src=0)
            payload[i] = replace(payload[i], draft_probs=p)
        with torch.inference_mode():
            getattr(engine, op)(payload)
