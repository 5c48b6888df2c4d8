"""From the measurements to an answer: acceptance by position, the round's costs, the speedup
each K should give (policy.py's model) beside the one it gave, the best K and a verdict in the
terms of the usual checklist (baseline, acceptance on your prompts, K, when not to speculate)."""
from __future__ import annotations

import statistics

from ..planning.estimates import LinearFit, expected_tokens
from .measure import Measurement

PAYS = 1.05        # a best speedup below this is not worth a draft model's memory
LOW_ACCEPTANCE = 0.3
SLOW_DRAFT = 0.3   # c: a draft token's cost in target passes


def acceptance_by_position(ms: list[Measurement]) -> list[float]:
    """Per position j: accepted / reached, from the run with the largest K."""
    m = max(ms, key=lambda m: m.k)
    return [a / r if r else 0.0 for a, r in zip(m.accepted_at, m.reached)]


def cost_fit(ms: list[Measurement]) -> dict[str, tuple[float, float]]:
    """Seconds of a steady round's parts as (fixed, per draft token), fitted over the K runs."""
    fits = {"draft": LinearFit((0.0, 0.0), decay=1.0, ridge=1e-9),
            "verify": LinearFit((0.0, 0.0), decay=1.0, ridge=1e-9),
            "other": LinearFit((0.0, 0.0), decay=1.0, ridge=1e-9)}
    for m in ms:
        if not m.steady_rounds:
            continue
        if m.k:
            fits["draft"].add(m.k, m.draft_s / m.steady_rounds)
        fits["verify"].add(m.k, m.verify_s / m.steady_rounds)
        fits["other"].add(0, m.other_s / m.steady_rounds)
    return {name: f.coef for name, f in fits.items()}


def predicted_speedup(k: int, acceptance: list[float], costs: dict) -> float:
    """E(k) / T(k) over 1 / T(0): the model the server's policy decides with."""
    a = (acceptance + [acceptance[-1] if acceptance else 0.0] * k)[:k]
    (d0, d1), (v0, v1), (o0, _) = costs["draft"], costs["verify"], costs["other"]
    t = (d0 + d1 * k if k else 0.0) + v0 + v1 * k + o0
    return expected_tokens(a)[k] * (v0 + o0) / t


def analyse(local: list[Measurement], remote: list[Measurement] | None) -> dict:
    base = next(m for m in local if m.k == 0)
    acceptance = acceptance_by_position(local)
    costs = cost_fit(local)
    verify0 = base.verify_s / max(base.steady_rounds, 1)
    rows = []
    for m in local:
        row = {"k": m.k, "tokens_per_s": m.tokens_per_s,
               "speedup": m.tokens_per_s / base.tokens_per_s,
               "predicted_speedup": predicted_speedup(m.k, acceptance, costs),
               "acceptance": m.acceptance, "tokens_per_round": m.tokens_per_round,
               "c": (m.draft_s / m.steady_rounds / m.k) / verify0 if m.k and m.steady_rounds
               else None,
               "same_output_as_target_only": sum(a == b for a, b in zip(m.outputs, base.outputs))}
        r = next((x for x in remote or [] if x.k == m.k), None)
        if r is not None:
            r0 = next(x for x in remote if x.k == 0)
            row.update(server_tokens_per_s=r.tokens_per_s,
                       server_speedup=r.tokens_per_s / r0.tokens_per_s,
                       server_acceptance=r.acceptance)
        rows.append(row)
    auto = next((x for x in remote or [] if x.k < 0), None)
    measured = "server_speedup" if remote else "speedup"
    best = max(rows, key=lambda r: r.get(measured) or 0.0)
    out = {"acceptance_by_position": acceptance, "costs_s": costs, "rows": rows,
           "best_k": best["k"], "best_speedup": best.get(measured), "measured_on":
           "server" if remote else "in process",
           "median_output_tokens": statistics.median(len(o) for o in base.outputs),
           "predicted_best_k": max(rows, key=lambda r: r["predicted_speedup"])["k"]}
    if auto is not None:
        r0 = next(x for x in remote if x.k == 0)
        out["server_auto"] = {"tokens_per_s": auto.tokens_per_s,
                              "speedup": auto.tokens_per_s / r0.tokens_per_s,
                              "acceptance": auto.acceptance}
    out["speculate"], out["verdict"] = verdict(out)
    return out


def verdict(a: dict) -> tuple[bool, str]:
    best, k = a["best_speedup"] or 0.0, a["best_k"]
    a1 = a["acceptance_by_position"][0] if a["acceptance_by_position"] else 0.0
    c = next((r["c"] for r in a["rows"] if r["k"] == k and r["c"] is not None), None)
    notes = []
    if a["median_output_tokens"] < 16:
        notes.append(f"answers are short (median {a['median_output_tokens']:.0f} tokens) and "
                     "the first token is the target's prefill alone, so speculation can only "
                     "speed up the rest")
    notes.append("measured at one stream: under load the server's auto policy lowers k as "
                 "verification gets dearer (specdec_round_cost_seconds)")
    if best < PAYS:
        if a1 < LOW_ACCEPTANCE:
            why = (f"do not speculate: low acceptance, the target accepts {a1:.0%} of the "
                   f"draft's first tokens on these prompts; train a draft on them "
                   f"(`specdec distill`) or serve target-only (num_draft_tokens=0)")
        elif c is not None and c > SLOW_DRAFT:
            why = (f"do not speculate: the draft is too slow, a drafted token costs {c:.2f} "
                   f"of a target pass; use a smaller draft")
        else:
            why = ("do not speculate: the round's fixed costs (calls, overheads) eat the gain "
                   "at these model sizes on this machine")
        return False, "; ".join([f"{why} (best K={k}: {best:.2f}x)"] + notes)
    why = (f"speculate: K={k} gives {best:.2f}x the target alone {a['measured_on']} "
           f"(acceptance at position 1: {a1:.0%}); the server's default, auto, chooses k per "
           f"round from live acceptance and cost; send num_draft_tokens={k} to pin it")
    return True, "; ".join([why] + notes)


def markdown(a: dict, title: str) -> str:
    server = "server_tokens_per_s" in a["rows"][0]
    head = ["K", "tok/s", "speedup", "predicted", "accept", "tokens/round", "c"]
    head += ["server tok/s", "server speedup"] if server else []
    lines = [f"## {title}", "", "| " + " | ".join(head) + " |",
             "|" + "---:|" * len(head)]
    for r in a["rows"]:
        cells = [str(r["k"]), f"{r['tokens_per_s']:.1f}", f"{r['speedup']:.2f}",
                 f"{r['predicted_speedup']:.2f}", _f(r["acceptance"]), _f(r["tokens_per_round"]),
                 _f(r["c"], "{:.3f}")]
        if server:
            cells += [_f(r.get("server_tokens_per_s"), "{:.1f}"), _f(r.get("server_speedup"))]
        lines.append("| " + " | ".join(cells) + " |")
    pos = " ".join(f"{x:.2f}" for x in a["acceptance_by_position"])
    lines += ["", f"Acceptance by position (given the earlier ones accepted): {pos or '-'}",
              f"Best K: {a['best_k']} ({a['measured_on']}, {a['best_speedup']:.2f}x); "
              f"the cost model predicts K={a['predicted_best_k']}."]
    if "server_auto" in a:
        s = a["server_auto"]
        lines.append(f"Server auto: {s['tokens_per_s']:.1f} tok/s, {s['speedup']:.2f}x.")
    lines += ["", f"Verdict: {a['verdict']}."]
    return "\n".join(lines) + "\n"


def _f(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)
