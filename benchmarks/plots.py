"""Figures of the committed results, for docs/: how much faster each proposer serves, how often
its drafts are accepted at each position, where a round's time goes on a GPU and on the CPU,
and how the GPU's step time grows with the batch. Nothing is measured here: every number is
read from the result files named below (under benchmarks/results/), and each figure names its
machine and its data's date. One command redraws them all into docs/img/:

    .venv/bin/python benchmarks/plots.py

- speedup.png: served tokens/s over target-only's at the same stream count, compare.py's auto-K
  row of each proposer; held-out code prompts (draft model, EAGLE-3 head) and
  out-of-domain prose (hybrid); the embedded default pair on a 2-core CPU. No GPU panel: the
  committed served GPU runs (2026-11-27-h200-served, 2026-11-27-h100-served) use random
  weights, nothing is accepted, and their tok/s is a proposer's cost, not a speedup.
- acceptance.png: accepted / drafted at each draft position, K=8, in process (proposers.py),
  with the EAGLE-3 head's from `specdec tune` (its per-position rates multiplied out).
- round_time.png: a round's engine calls at K=4 (costs.py, in process, no server), by batch:
  the target's verification plus the draft model's proposal or the EAGLE-3 head's drafting,
  beside target-only's one-token step; an H200 (random weights at Llama-3.1-8B / 3.2-1B
  shapes, bfloat16, CUDA graphs) and the 2-core CPU (default pair, float32).
- gpu_step_batch.png: the H200's target step and verify(K) against the batch.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import operator
import re
import sys
import textwrap
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent

HELDOUT = "2026-11-24k-eagle-compare-heldout.json"
PROSE = "2026-11-24r-hybrid-compare-prose-4streams-loops.json"
ACCEPTANCE = "2026-11-28-proposers-acceptance-cpu.json"
EAGLE_TUNE = "2026-11-24m-tune-eagle.json"
GPU_COSTS = "2026-11-26-h200/costs-4141d03.json"
CPU_COSTS = "2026-11-28-costs-cpu.json"
SOURCES = (HELDOUT, PROSE, ACCEPTANCE, EAGLE_TUNE, GPU_COSTS, CPU_COSTS)
# Rows a later run superseded: the held-out run's hybrid predates the lookup that follows loops
# (docs/benchmarks.md's hybrid figures are of the later run).
SUPERSEDED = {HELDOUT: {"hybrid"}}

K = 4                  # round_time.png's drafts per round: the served GPU runs' fixed K
VERIFY_KS = ("2", "4", "8")
DPI = 100
LABELS = {"draft": "draft model", "eagle": "EAGLE-3 head", "hybrid": "hybrid (lookup, else draft)",
          "n-gram": "n-gram lookup"}
COLORS = {"draft": "C0", "eagle": "C1", "hybrid": "C2", "n-gram": "C3"}
WORKLOADS = {"free": "held-out code prompts", "repeating": "prompts that repeat their context"}


def load(results: Path, name: str) -> dict:
    return json.loads((results / name).read_text())


def data_date(result: dict, name: str) -> str:
    """The result's own date field, else the date its file or folder is named with."""
    return result.get("date", re.search(r"\d{4}-\d{2}-\d{2}", name).group())[:10]


def cpu(machine: dict) -> str:
    return f"{machine['cpu']} CPU, {machine['cpu_count']} cores"


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def figure(panels: int, width: float = 5.5, **kw) -> tuple[Figure, list]:
    fig = Figure(figsize=(width * panels, 4.8), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig, list(fig.subplots(1, panels, squeeze=False, **kw)[0])


def finish(fig: Figure, title: str, subtitle: str) -> Figure:
    fig.suptitle(title, fontsize=12, y=0.975)
    # About 15 characters of 8.5 pt text an inch: wrapped, the subtitle stays inside the figure.
    fig.text(0.5, 0.905, textwrap.fill(subtitle, int(15 * fig.get_figwidth())), ha="center",
             va="center", fontsize=8.5, color="0.3")
    fig.tight_layout(rect=(0, 0, 1, 0.87))
    return fig


def auto_speedups(rows: list[dict]) -> dict[str, dict[int, float]]:
    """{proposer: {streams: tok/s of its auto-K row over target-only's at those streams}}."""
    base = {r["streams"]: r["tokens_per_s"] for r in rows if r["setting"] == "target-only"}
    out: dict[str, dict[int, float]] = {}
    for r in rows:
        if r["k"] == -1:        # compare.py's auto K
            out.setdefault(r["proposer"], {})[r["streams"]] = r["tokens_per_s"] / base[r["streams"]]
    return out


def speedup(results: Path) -> Figure:
    fig, axes = figure(2, sharey=True)
    panels = ((HELDOUT, "held-out code prompts"), (PROSE, "out-of-domain prose"))
    for ax, (name, workload) in zip(axes, panels):
        r = load(results, name)
        by = {p: s for p, s in auto_speedups(r["rows"]).items()
              if p not in SUPERSEDED.get(name, ())}
        streams = sorted({n for s in by.values() for n in s})
        width = 0.8 / max(len(by), 3)      # one width in every panel
        for i, (proposer, s) in enumerate(by.items()):
            x = [j + (i - (len(by) - 1) / 2) * width for j in range(len(streams))]
            bars = ax.bar(x, [s.get(n, math.nan) for n in streams], width,
                          label=LABELS[proposer], color=COLORS[proposer])
            ax.bar_label(bars, fmt="%.2fx", fontsize=8)
        ax.axhline(1.0, color="0.4", lw=0.8, ls="--")      # target-only
        ax.margins(y=0.25)
        ax.set_xticks(range(len(streams)),
                      [f"{n} stream{'s' if n > 1 else ''}" for n in streams])
        ax.set_title(f"{workload} ({data_date(r, name)})", fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    axes[0].set_ylabel("served tokens/s over target-only's (x)")
    r = load(results, HELDOUT)
    c = r["config"]
    return finish(fig, f"Served speedup by proposer, auto K: {cpu(r['machine'])}",
                  f"default pair, greedy, {c['requests']} requests of {c['max_tokens']} tokens, "
                  f"{c['repeats']} repeats (compare.py); dashed: target-only; data of "
                  f"{data_date(r, HELDOUT)}")


def acceptance(results: Path) -> Figure:
    r = load(results, ACCEPTANCE)
    tune = load(results, EAGLE_TUNE)
    fig, axes = figure(2, sharey=True)
    for ax, workload in zip(axes, WORKLOADS):
        for row in r["rows"]:
            a = row["acceptance_by_position"]
            if row["workload"] == workload and a:
                proposer = row["setting"].split(" K=")[0]
                ax.plot(range(1, len(a) + 1), a, marker="o", color=COLORS[proposer],
                        label=f"{LABELS[proposer]}, K={row['k']}")
        ax.set_title(WORKLOADS[workload], fontsize=10)
        ax.set_xlabel("draft position")
        ax.set_ylim(0, 1)
    # tune records accepted / reached (earlier positions all accepted); their running product
    # is accepted / drafted, the proposers' measure. Its prompts are the held-out ones.
    eagle = list(itertools.accumulate(tune["acceptance_by_position"], operator.mul))
    axes[0].plot(range(1, len(eagle) + 1), eagle, marker="s", ls="--", color=COLORS["eagle"],
                 label=f"{LABELS['eagle']}, K={len(eagle)} (specdec tune, "
                       f"{tune['num_prompts']} prompts, {data_date(tune, EAGLE_TUNE)})")
    for ax in axes:
        ax.legend(fontsize=8)
    axes[0].set_ylabel("rounds accepting the position / drafting it")
    argv = r["argv"]
    return finish(fig, f"Acceptance by draft position: {cpu(r['machine'])}",
                  f"default pair, greedy, in process (proposers.py), {option(argv, '--prompts')} "
                  f"prompts of {option(argv, '--max-tokens')} tokens, 1 stream; data of "
                  f"{data_date(r, ACCEPTANCE)}")


def round_parts(run: dict[str, dict], k: int) -> dict[str, list[float]]:
    """Per batch, ascending: ms of the target's one-token step, its verify(k), the draft model's
    proposal of k, and the EAGLE-3 head's part of a verification that also drafts k."""
    rows = [run[b] for b in sorted(run, key=int)]
    verify = [x["verify_ms"][str(k)] for x in rows]
    return {"step": [x["step_ms"] for x in rows], "verify": verify,
            "draft": [x["propose_ms"][str(k)] for x in rows],
            "head": [x["head_verify_ms"][str(k)] - v for x, v in zip(rows, verify)]}


def served_run(costs: dict) -> dict[str, dict]:
    """CUDA graphs on, as served on a GPU; the CPU has no graphs."""
    return costs["runs"].get("CUDA graphs on") or costs["runs"]["CUDA graphs off"]


def round_time(results: Path) -> Figure:
    fig, axes = figure(2)
    gpu, host = load(results, GPU_COSTS), load(results, CPU_COSTS)
    for ax, costs, name in ((axes[0], gpu, GPU_COSTS), (axes[1], host, CPU_COSTS)):
        run = served_run(costs)
        batches = sorted(run, key=int)
        p = round_parts(run, K)
        w = 0.27
        x = range(len(batches))
        # Per batch: target-only's step, the draft model's round, the EAGLE-3 head's round;
        # both rounds stand on the target's verification.
        left, mid, right = ([i + d * w for i in x] for d in (-1, 0, 1))
        ax.bar(left, p["step"], w, color="0.85", edgecolor="0.3",
               label="target step (target-only round)")
        ax.bar(mid + right, p["verify"] * 2, w, color="0.45", label=f"target verify(K={K})")
        ax.bar(mid, p["draft"], w, bottom=p["verify"], color=COLORS["draft"],
               label=f"draft model: propose {K}")
        ax.bar(right, p["head"], w, bottom=p["verify"], color=COLORS["eagle"],
               label=f"EAGLE-3 head: catch up, draft {K}")
        ax.set_xticks(list(x), [f"batch {b}\nstep | draft | EAGLE" for b in batches])
        ax.set_ylabel("ms per round")
        ax.margins(y=0.3)
        machine = costs["machine"]
        where = (f"{machine['gpu']}, {costs['dtype']}" if machine.get("gpu")
                 else f"{cpu(machine)}, {costs['dtype']}")
        ax.set_title(f"{where} ({data_date(costs, name)})", fontsize=10)
        ax.legend(fontsize=8, loc="upper left")
    return finish(fig, f"Where a K={K} round's time goes: {gpu['machine']['gpu']} GPU and "
                       f"{host['machine']['cpu']} CPU",
                  "engine calls in process (costs.py), no server or loop overhead; GPU: random "
                  "weights at Llama-3.1-8B / 3.2-1B shapes, CUDA graphs; CPU: default pair; "
                  f"{gpu['context']} cached tokens per row")


def gpu_step_batch(results: Path) -> Figure:
    costs = load(results, GPU_COSTS)
    run = served_run(costs)
    batches = sorted(run, key=int)
    fig, (ax,) = figure(1, width=8)
    ax.plot([int(b) for b in batches], [run[b]["step_ms"] for b in batches], marker="o",
            color="0.2", label="target step (1 token a row)")
    for i, k in enumerate(VERIFY_KS):
        ax.plot([int(b) for b in batches], [run[b]["verify_ms"][k] for b in batches],
                marker="o", color=f"C{i}", label=f"verify(K={k}): {int(k) + 1} tokens a row")
    ax.set_xscale("log", base=2)
    ax.set_xticks([int(b) for b in batches], batches)
    ax.set_xlabel("batch (rows)")
    ax.set_ylabel("ms per call")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return finish(fig, f"Target step against batch: {costs['machine']['gpu']}",
                  f"random weights at Llama-3.1-8B's shape, {costs['dtype']}, CUDA graphs, "
                  f"{costs['context']} cached tokens per row (costs.py); data of "
                  f"{data_date(costs, GPU_COSTS)}")


FIGURES = {"speedup.png": speedup, "acceptance.png": acceptance, "round_time.png": round_time,
           "gpu_step_batch.png": gpu_step_batch}


def figures(results: Path) -> dict[str, Figure]:
    return {name: draw(results) for name, draw in FIGURES.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=HERE / "results",
                    help="where the result files are (default benchmarks/results)")
    ap.add_argument("--out", type=Path, default=HERE.parent / "docs" / "img",
                    help="where the PNGs go (default docs/img)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, fig in figures(args.results).items():
        fig.savefig(args.out / name, dpi=DPI)
        print(f"wrote {args.out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
