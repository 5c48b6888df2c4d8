"""A draft model in the target's process: the in-target drafter (runtime/in_target.py) that
drafts with an engine of its own, or with the target's own layers less a skip set (swift.py)."""
from __future__ import annotations

import torch

from ..records import ProposeCall, SlotError
from ..runtime.in_target import DraftEngine, InTargetDrafter, Verified


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
