"""`specdec tune --self`: which layers the target skips to draft for itself (SWIFT, swift.py),
searched on the user's prompts.

A candidate skip set is scored as SWIFT (Xia et al. 2024) scores it, by its matchness: the
target with those layers skipped reads, in one teacher-forced forward, the text the target itself
generated greedily, and matchness is the share of positions where its argmax is the target's next
token. Under greedy decoding that is the loop's acceptance: an accepted draft is the target's
token, so every draft position is read in the target's own context (the draft's KV included),
up to rounding between one forward and many. The cost is measured: one decode step of the
target with k layers kept against the target's own step (Engine.propose both, on this device),
at a few k, fitted linearly in k (every layer costs the same). The score is Leviathan et al.'s
expected speedup E / (cK + 1), E = (1 - a^(K+1)) / (1 - a), at its best K.

The search is SWIFT's (random masks, then Bayesian optimisation, keeping the better set): random
masks; Thompson sampling from a Bayesian linear model of log matchness over the skipped-layer
mask (per draw, the best set for each skip count, then the count with the best predicted
speedup); greedy refinement by single-layer flips from the best. When every subset of the
skippable layers fits the budget, all are scored. The best set is then run in the real loop (the
target's Engine verifies, an Engine over the SkipView drafts) against target-only, measured as
`specdec tune` measures a draft model.
"""
from __future__ import annotations

import math
import random
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from ..runtime.engine import Engine
from ..planning.estimates import LinearFit, expected_tokens
from ..runtime.kv_cache import KVCache
from ..runtime.batch import Batch
from ..records import ProposeCall, SamplingParams, SlotError
from ..proposers.swift import SETTING, SkipView, format_skip
from .measure import measure
from .report import PAYS, acceptance_by_position

ROWS = 8          # prompts per teacher-forced forward
STEP_REPS = 10    # timed decode steps per kept-layer count (the median counts)
NOISE = 0.05      # variance of log matchness around the linear model (Thompson sampling)


@dataclass
class Candidate:
    skip: tuple[int, ...]
    acceptance: float     # matchness: accepted drafts per drafted position, greedy
    c: float              # a draft step's cost in target steps
    k: int                # the draft length with the best expected speedup
    speedup: float        # Leviathan's E / (cK + 1) at k


def leviathan(a: float, c: float, k_max: int) -> tuple[int, float]:
    """(K, speedup) of the best K in 1..k_max at per-token acceptance a and cost ratio c."""
    return max(((k, expected_tokens([a] * k)[k] / (c * k + 1)) for k in range(1, k_max + 1)),
               key=lambda ks: ks[1])


class Matchness:
    """Teacher-forced acceptance of skip sets over (prompt, the target's continuation) pairs."""

    def __init__(self, engine: Engine, pairs: list[tuple[list[int], list[int]]]):
        # Position len(prompt) + j predicts continuation[j + 1]; continuation[0] is the target's
        # prefill's token, never drafted.
        self.rows = [(p + c[:-1], len(p), c[1:]) for p, c in pairs if len(c) >= 2]
        if not self.rows:
            raise ValueError("the target's answers to these prompts are under 2 tokens: "
                             "nothing to draft, nothing to score")
        self.target, self.device = engine.model, engine.device
        a = self.target.args
        self.cache = KVCache(a.num_layers - 1, ROWS, max(len(r[0]) for r in self.rows),
                             a.num_kv_heads, a.head_dim, engine.dtype, engine.device)

    def __call__(self, skip: tuple[int, ...]) -> float:
        return torch.cat(self.matches(skip)).float().mean().item()

    @torch.inference_mode()
    def matches(self, skip: tuple[int, ...]) -> list[torch.Tensor]:
        """Per scored pair, [len(continuation) - 1] bool: does the draft's argmax at each
        position after the first token equal the target's token there."""
        view = SkipView(self.target, skip)
        out = []
        for g in range(0, len(self.rows), ROWS):
            group = self.rows[g: g + ROWS]
            batch = Batch.build([r[0] for r in group], [0] * len(group), list(range(len(group))),
                                self.cache, self.device)
            hidden = view(batch, self.cache)
            for b, (_, first, expected) in enumerate(group):
                guess = view.logits(hidden[b, first: first + len(expected)]).argmax(-1)
                out.append((guess == torch.tensor(expected, device=self.device)).cpu())
        return out


def step_seconds(engine: Engine, context: list[int], reps: int = STEP_REPS) -> float:
    """Median seconds of one decode step at len(context) cached tokens: one token in, one
    drafted out (Engine.propose, the call a draft runs)."""
    seq, greedy = 1 << 40, SamplingParams()
    calls = [[ProposeCall(seq, 0, context, 1, greedy)]] + [
        [ProposeCall(seq, len(context) - 1, context[-1:], 1, greedy)]] * (reps + 2)
    times = []
    for call in calls:
        t0 = time.perf_counter()
        (r,) = engine.propose(call)
        times.append(time.perf_counter() - t0)
        if isinstance(r, SlotError):
            raise r
    engine.release([seq])
    return statistics.median(times[3:])


def cost_model(target: Engine, context: list[int]) -> tuple[LinearFit, dict[int, float]]:
    """Decode-step seconds against kept layers: measured with the first and last kept and
    evenly spaced ones between, at 2, about half and all of the target's layers."""
    n = target.model.args.num_layers
    points = {}
    for kept in sorted({min(2, n), (n + 2) // 2, n}):
        if kept == n:
            points[n] = step_seconds(target, context)
            continue
        keep = {0, n - 1} | {round(1 + j * (n - 3) / max(kept - 3, 1)) for j in range(kept - 2)}
        view = SkipView(target.model, [i for i in range(n) if i not in keep])
        points[kept] = step_seconds(Engine(view, 1, target.max_len, target.device), context)
    fit = LinearFit((0.0, 0.0), decay=1.0, ridge=1e-9)
    for kept, s in points.items():
        fit.add(kept, s)
    return fit, points


def search(score, middle: list[int], budget: int, seed: int = 0, bar=None
           ) -> dict[tuple[int, ...], Candidate]:
    """Scored candidates by skip set; score(skip) -> Candidate, at most `budget` of them."""
    seen: dict[tuple[int, ...], Candidate] = {}
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)

    def scored(skip) -> Candidate | None:
        skip = tuple(sorted(skip))
        if skip not in seen and len(seen) < budget and skip:
            seen[skip] = score(skip)
            if bar is not None:
                best = max(seen.values(), key=lambda c: c.speedup)
                bar.update(1)
                bar.set_postfix(best=f"{format_skip(best.skip)} {best.speedup:.2f}x")
        return seen.get(skip)

    d = len(middle)
    if 2 ** d - 1 <= budget:
        for mask in range(1, 2 ** d):
            scored([middle[j] for j in range(d) if mask >> j & 1])
        return seen
    for _ in range(max(2, budget // 4)):
        scored(rng.sample(middle, rng.randint(1, d)))
    for _ in range(budget // 2):
        skip = _thompson(seen, middle, score, gen)
        while tuple(skip) in seen:   # a set already scored: a random neighbour of it instead
            skip = sorted(set(skip) ^ {rng.choice(middle)}) or [rng.choice(middle)]
        scored(skip)
    best = max(seen.values(), key=lambda c: c.speedup)
    while len(seen) < budget:
        flips = [sorted(set(best.skip) ^ {i}) for i in rng.sample(middle, d)]
        better = [c for c in map(scored, flips) if c is not None and c.speedup > best.speedup]
        if not better:
            break
        best = max(better, key=lambda c: c.speedup)
    return seen


def _thompson(seen: dict[tuple[int, ...], Candidate], middle: list[int], score,
              gen: torch.Generator) -> list[int]:
    """One draw of log matchness ~ w0 + sum of w_i over the skipped layers (prior N(0, 1) per
    layer, a free intercept): for each skip count the draw's best set, and of those the one whose
    speedup, at that count's measured cost, the draw predicts highest."""
    x = torch.tensor([[1.0] + [float(i in s) for i in middle] for s in seen], dtype=torch.float64)
    y = torch.tensor([math.log(max(c.acceptance, 1e-3)) for c in seen.values()],
                     dtype=torch.float64)
    prior = torch.eye(x.shape[1], dtype=torch.float64)
    prior[0, 0] = 1e-6
    cov = torch.linalg.inv(x.T @ x / NOISE + prior)
    mean = cov @ x.T @ y / NOISE
    w = mean + torch.linalg.cholesky(cov) @ torch.randn(len(mean), generator=gen,
                                                        dtype=torch.float64)
    order = sorted(range(len(middle)), key=lambda j: -float(w[1 + j]))
    options = []
    for n in range(1, len(middle) + 1):
        a = math.exp(min(0.0, float(w[0] + w[1 + torch.tensor(order[:n])].sum())))
        options.append((score.predict(a, n), [middle[j] for j in order[:n]]))
    return max(options)[1]


class Scorer:
    """score(skip) -> Candidate: matchness, the fitted cost of its kept layers, the best K."""

    def __init__(self, matchness: Matchness, cost: LinearFit, num_layers: int, k_max: int):
        self.matchness, self.cost, self.n, self.k_max = matchness, cost, num_layers, k_max

    def c(self, skipped: int) -> float:
        return max(self.cost(self.n - skipped) / self.cost(self.n), 1e-3)

    def predict(self, a: float, skipped: int) -> float:
        return leviathan(a, self.c(skipped), self.k_max)[1]

    def __call__(self, skip: tuple[int, ...]) -> Candidate:
        a, c = self.matchness(skip), self.c(len(skip))
        return Candidate(skip, a, c, *leviathan(a, c, self.k_max))


def tune(target: Engine, ids: list[list[int]], k_max: int, max_tokens: int,
         eos: tuple[int, ...], budget: int, bar, seed: int = 0) -> tuple[dict, str]:
    """The search and the best set's run in the loop: (the report's fields, its text)."""
    n = target.model.args.num_layers
    middle = list(range(1, n - 1))
    if not middle:
        raise ValueError(f"a target of {n} layers has none to skip: the first and the last "
                         f"are always kept")
    budget = min(budget, 2 ** len(middle) - 1)
    bar.reset(total=budget + 2 * len(ids))
    bar.set_description("in process K=0")
    probe = Engine(SkipView(target.model, middle), 1, target.max_len, target.device)
    base = measure(target, probe, ids, 0, max_tokens, eos, lambda: bar.update(1))
    bar.set_description("step costs")
    cost, points = cost_model(target, ids[0] + base.outputs[0])
    scorer = Scorer(Matchness(target, list(zip(ids, base.outputs))), cost, n, k_max)
    bar.set_description("skip sets")
    seen = search(scorer, middle, budget, seed, bar)
    ranked = sorted(seen.values(), key=lambda c: -c.speedup)
    best = ranked[0]
    bar.set_description(f"in process K={best.k}")
    view = SkipView(target.model, best.skip)
    drafting = Engine(view, 1, target.max_len, target.device)
    m = measure(target, drafting, ids, best.k, max_tokens, eos, lambda: bar.update(1))
    bar.close()
    by_position = acceptance_by_position([m])
    a_loop = sum(m.accepted_at) / max(sum(m.reached), 1)
    verify0 = base.verify_s / max(base.steady_rounds, 1)
    measured = m.tokens_per_s / base.tokens_per_s
    pays = measured >= PAYS
    per_token = view.kv_bytes(1, 1, target.dtype) // 2    # a pool of one slot (+ scratch)
    setting = f"{SETTING}={format_skip(best.skip)}"
    if pays:
        verdict = (f"self-speculation pays: {setting} drafts with {len(view.kept)} of {n} "
                   f"layers and gives {measured:.2f}x the target alone in process at K={best.k}")
    else:
        verdict = (f"no skip set pays on this target here: the best, {setting} ({len(view.kept)} "
                   f"of {n} layers kept), gives {measured:.2f}x the target alone in process at "
                   f"K={best.k} (predicted {best.speedup:.2f}x at acceptance {best.acceptance:.2f}"
                   f", c {best.c:.2f}); do not serve proposer=self")
    result = {
        "self": {
            "setting": setting if pays else None, "skip": format_skip(best.skip),
            "kept_layers": len(view.kept), "num_layers": n, "k": best.k,
            "acceptance": best.acceptance, "acceptance_in_loop": a_loop,
            "acceptance_by_position": by_position, "c": best.c,
            "c_in_loop": (m.draft_s / m.steady_rounds / best.k) / verify0 if m.steady_rounds
            else None,
            "predicted_speedup": best.speedup,
            "predicted_speedup_in_loop": leviathan(a_loop, best.c, k_max)[1],
            "speedup": measured, "tokens_per_s": m.tokens_per_s,
            "target_tokens_per_s": base.tokens_per_s,
            "same_output_as_target_only": sum(a == b for a, b in zip(m.outputs, base.outputs)),
            "draft_kv_bytes_per_token": per_token,
            "target_kv_bytes_per_token": per_token * n // len(view.kept),
            "step_seconds_by_kept_layers": points, "scored": len(seen), "budget": budget,
            "candidates": [asdict(c) | {"skip": format_skip(c.skip)} for c in ranked[:10]]},
        "speculate": pays, "verdict": verdict}
    return result, _markdown(result["self"], ranked, verdict)


def _markdown(r: dict, ranked: list[Candidate], verdict: str) -> str:
    lines = [f"Scored {r['scored']} skip sets of layers 1..{r['num_layers'] - 2} (budget "
             f"{r['budget']}); the best by predicted speedup:", "",
             "| skip | kept | acceptance | c | K | predicted |", "|---|---:|---:|---:|---:|---:|"]
    for c in ranked[:5]:
        lines.append(f"| {format_skip(c.skip)} | {r['num_layers'] - len(c.skip)} | "
                     f"{c.acceptance:.2f} | {c.c:.2f} | {c.k} | {c.speedup:.2f} |")
    lines += ["", f"{SETTING}={r['skip']}: acceptance {r['acceptance']:.2f} (in the loop "
              f"{r['acceptance_in_loop']:.2f}), c {r['c']:.2f}, predicted speedup "
              f"{r['predicted_speedup']:.2f}x at K={r['k']}; measured in process "
              f"{r['speedup']:.2f}x ({r['tokens_per_s']:.1f} against {r['target_tokens_per_s']:.1f}"
              f" tok/s); draft KV {r['kept_layers']} of {r['num_layers']} layers, "
              f"{r['draft_kv_bytes_per_token'] / 1024:.1f} KiB per token (the target's "
              f"{r['target_kv_bytes_per_token'] / 1024:.1f}).", "", f"Verdict: {verdict}."]
    return "\n".join(lines) + "\n"
