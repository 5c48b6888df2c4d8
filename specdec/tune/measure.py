"""Generation through the project's own engine and loop, in this process: what one K does to
one stream, measured the way the server runs it (greedy, the same engine code, no Triton)."""
from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..runtime.engine import Engine
from ..proposers.eagle.checkpoint import HeadCheckpoint
from ..decoding.local import LocalDrafter, LocalVerifier
from ..decoding.loop import speculate
from ..records import Proposer, Request, Round


@dataclass
class Measurement:
    """One K over all prompts, one request at a time."""
    k: int
    requests: int = 0
    tokens: int = 0
    seconds: float = 0.0            # summed request wall times
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    # Steady rounds only (no prompt prefill, no draft catching up): what a round costs.
    steady_rounds: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    other_s: float = 0.0
    reached: list[int] = field(default_factory=list)     # rounds that drafted position j with
    accepted_at: list[int] = field(default_factory=list)  # 1..j-1 accepted; of those, j accepted
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        return self.tokens / self.rounds if self.rounds else None

    def add_round(self, r: Round) -> None:
        self.rounds += 1
        self.drafted += r.k
        self.accepted += r.accepted
        for j in range(min(r.accepted + 1, r.k)):
            while len(self.reached) <= j:
                self.reached.append(0)
                self.accepted_at.append(0)
            self.reached[j] += 1
            self.accepted_at[j] += j < r.accepted
        if not r.prefill and r.draft_fed <= 2 and r.other_s is not None:
            self.steady_rounds += 1
            self.draft_s += r.draft_s
            self.verify_s += r.verify_s
            self.other_s += r.other_s


def load_engines(target: Path, draft: Path | None, device: torch.device, dtype: torch.dtype,
                 max_len: int, vocab_size: int, head: Path | None = None
                 ) -> tuple[Engine, Engine | None]:
    """The target (with `head`, an EAGLE-3 head beside it, as target_model loads one) and the
    draft model, or None when a head is tuned instead."""
    t = Engine.load(str(target), 1, max_len, dtype, device, vocab_size=vocab_size,
                    head=HeadCheckpoint(str(head)) if head else None)
    if draft is None:
        return t, None
    return t, Engine.load(str(draft), 1, max_len, dtype, device, vocab_size=vocab_size)


_ids = itertools.count(1)


def generate(target: Engine, draft: Engine | None, prompt: list[int], k: int, max_tokens: int,
             eos: tuple[int, ...], m: Measurement | None) -> list[int]:
    """One greedy request at exactly k drafts a round, by the draft model, or by the target's
    EAGLE-3 head when there is no draft; adds its figures to m."""
    out: list[int] = []
    t0 = time.perf_counter()
    proposer = Proposer.DRAFT if draft is not None else Proposer.EAGLE
    asyncio.run(speculate(next(_ids), Request(prompt, max_tokens, k, eos=eos, proposer=proposer),
                          LocalDrafter(draft) if draft is not None else None,
                          LocalVerifier(target), target.max_len,
                          lambda chunk: out.extend(chunk.tokens),
                          on_round=m.add_round if m else None,
                          in_target=tuple(target.drafters)))
    if m is not None:
        m.seconds += time.perf_counter() - t0
        m.requests += 1
        m.tokens += len(out)
        m.outputs.append(out)
    return out


def measure(target: Engine, draft: Engine | None, prompts: list[list[int]], k: int, max_tokens: int,
            eos: tuple[int, ...], step=lambda: None) -> Measurement:
    """Every prompt once at k, after one unmeasured warm-up request; `step` after each."""
    generate(target, draft, prompts[0], k, max_tokens, eos, None)
    m = Measurement(k)
    for p in prompts:
        generate(target, draft, p, k, max_tokens, eos, m)
        step()
    return m
