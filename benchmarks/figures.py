"""The arithmetic of the benchmarks: percentiles, per-request latencies and the expected speedup
of draft-model speculation (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding")."""
from __future__ import annotations

from dataclasses import dataclass


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default), None for no data."""
    if not values:
        return None
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def theoretical_speedup(a: float, c: float, k: int) -> float:
    """Expected speedup of draft-model speculation (Leviathan et al. 2023, eq. 1 / Thm 3.8):
    tokens per round (1 - a^(K+1)) / (1 - a) over the round's cost (cK + 1) target passes."""
    if k == 0:
        return 1.0
    tokens = (k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)
    return tokens / (c * k + 1.0)


def speedup_model(speedup: float, a: float, c: float, k: int, tokens_per_round: float) -> dict:
    """A measured speedup against the cost model: S(a, c, K), efficiency = speedup / S, and the
    same cost model with the measured tokens per round instead of the i.i.d. acceptance formula
    (acceptance is not i.i.d. across positions in practice)."""
    s = theoretical_speedup(a, c, k)
    return {"theoretical_speedup": s, "efficiency": speedup / s,
            "speedup_model_measured_tokens": tokens_per_round / (c * k + 1.0)}


@dataclass
class Req:
    """One request's client-side timings."""
    prompt_index: int
    tokens: int
    total_s: float
    ttft_s: float | None
    chunk_times_s: list[float]       # arrival of each non-empty piece, from the request's start
    chunk_tokens: list[int]          # tokens each piece carried
    text: str = ""
    finish_reason: str | None = None

    def itl(self) -> list[float]:
        """Per-token inter-token latencies: each gap between pieces, split over its tokens."""
        out: list[float] = []
        for j in range(1, len(self.chunk_times_s)):
            n = max(self.chunk_tokens[j], 1)
            out += [(self.chunk_times_s[j] - self.chunk_times_s[j - 1]) / n] * n
        return out


def latency_summary(reqs: list[Req]) -> dict:
    ttft = [r.ttft_s for r in reqs if r.ttft_s is not None]
    itl = [x for r in reqs for x in r.itl()]
    tokens = sum(r.tokens for r in reqs)
    busy = sum(r.total_s for r in reqs)
    return {
        "requests": len(reqs),
        "output_tokens": tokens,
        "tokens_per_s": tokens / busy if busy else None,
        "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
        "itl_p50_s": percentile(itl, 50), "itl_p99_s": percentile(itl, 99),
        "mean_tokens_per_chunk": tokens / max(sum(len(r.chunk_times_s) for r in reqs), 1),
    }
