"""benchmarks/plots.py draws the committed results (part of `make test`): every PNG is written
and is a PNG of a sensible size, and what each figure draws is what its result file says,
computed here again from the JSON, not through plots.py's helpers."""
import json
import math
import struct
from pathlib import Path

import pytest

import plots

RESULTS = Path(__file__).resolve().parent / "results"
PNG = b"\x89PNG\r\n\x1a\n"
PROPOSERS = {label: name for name, label in plots.LABELS.items()}


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def close(drawn, expected):
    assert len(drawn) == len(expected)
    assert all(math.isclose(d, e, rel_tol=1e-9) for d, e in zip(drawn, expected)), \
        (list(drawn), list(expected))


def bars(ax) -> dict[str, list[float]]:
    return {c.get_label(): list(c.datavalues) for c in ax.containers}


def texts(fig) -> str:
    return " ".join(t.get_text() for t in fig.texts)


@pytest.fixture(scope="module")
def figures():
    return plots.figures(RESULTS)


def test_writes_every_png(tmp_path):
    assert plots.main(["--results", str(RESULTS), "--out", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(["speedup.png", "acceptance.png", "round_time.png",
                              "gpu_step_batch.png"])
    for name in written:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == PNG and data[12:16] == b"IHDR", name
        width, height = struct.unpack(">II", data[16:24])
        assert 600 <= width <= 2000 and 300 <= height <= 1200, (name, width, height)
        assert len(data) < 150_000, (name, len(data))


def test_at_most_six_result_files_are_read():
    assert len(set(plots.SOURCES)) <= 6
    assert all((RESULTS / name).is_file() for name in plots.SOURCES)


def test_speedup_bars_are_auto_rows_over_target_only(figures):
    fig = figures["speedup.png"]
    panels = ((plots.HELDOUT, "held-out"), (plots.PROSE, "prose"))
    for ax, (name, workload) in zip(fig.axes, panels):
        assert workload in ax.get_title()
        rows = load(name)["rows"]
        base = {r["streams"]: r["tokens_per_s"] for r in rows if r["setting"] == "target-only"}
        expected: dict[str, dict[int, float]] = {}
        for r in rows:
            if r["setting"].endswith("auto"):
                expected.setdefault(r["proposer"], {})[r["streams"]] = \
                    r["tokens_per_s"] / base[r["streams"]]
                assert math.isclose(expected[r["proposer"]][r["streams"]], r["vs_target_only"])
        streams = [int(t.get_text().split()[0]) for t in ax.get_xticklabels()]
        drawn = {PROPOSERS[label]: heights for label, heights in bars(ax).items()}
        assert set(drawn) == set(expected) - plots.SUPERSEDED.get(name, set())
        for proposer, heights in drawn.items():
            close(heights, [expected[proposer][n] for n in streams])
    held_out = bars(fig.axes[0])
    assert round(held_out[plots.LABELS["draft"]][0], 2) == 1.61      # docs/benchmarks.md's
    assert set(bars(fig.axes[1])) == {plots.LABELS["hybrid"]}


def test_acceptance_lines_are_the_recorded_rates(figures):
    fig = figures["acceptance.png"]
    rows = load(plots.ACCEPTANCE)["rows"]
    for ax, workload in zip(fig.axes, ("free", "repeating")):
        lines = {line.get_label(): line for line in ax.get_lines()}
        recorded = [r for r in rows if r["workload"] == workload and r["k"] > 0]
        assert len(recorded) == 3
        for r in recorded:
            line = lines[f"{plots.LABELS[r['setting'].split(' K=')[0]]}, K={r['k']}"]
            close(line.get_ydata(), r["acceptance_by_position"])
            close(line.get_xdata(), range(1, r["k"] + 1))
    tune = load(plots.EAGLE_TUNE)["acceptance_by_position"]
    (eagle,) = [line for line in fig.axes[0].get_lines()
                if line.get_label().startswith(plots.LABELS["eagle"])]
    product, expected = 1.0, []
    for a in tune:
        product *= a
        expected.append(product)
    close(eagle.get_ydata(), expected)


@pytest.mark.parametrize("index, name", [(0, plots.GPU_COSTS), (1, plots.CPU_COSTS)])
def test_round_time_stacks_the_engine_calls(figures, index, name):
    fig = figures["round_time.png"]
    costs = load(name)
    run = costs["runs"]["CUDA graphs on" if index == 0 else "CUDA graphs off"]
    batches = sorted(run, key=int)
    k = str(plots.K)
    drawn = bars(fig.axes[index])
    step, verify, draft, head = (drawn[label] for label in drawn)
    close(step, [run[b]["step_ms"] for b in batches])
    close(verify, [run[b]["verify_ms"][k] for b in batches] * 2)
    close(draft, [run[b]["propose_ms"][k] for b in batches])
    close(head, [run[b]["head_verify_ms"][k] - run[b]["verify_ms"][k] for b in batches])
    where = costs["machine"]["gpu"] if index == 0 else costs["machine"]["cpu"]
    assert where in fig.get_suptitle() and where in fig.axes[index].get_title()
    assert name[:10] in fig.axes[index].get_title()


def test_gpu_step_batch_lines(figures):
    fig = figures["gpu_step_batch.png"]
    costs = load(plots.GPU_COSTS)
    run = costs["runs"]["CUDA graphs on"]
    batches = sorted(run, key=int)
    assert len(batches) >= 3
    (ax,) = fig.axes
    lines = ax.get_lines()
    close(lines[0].get_xdata(), [int(b) for b in batches])
    close(lines[0].get_ydata(), [run[b]["step_ms"] for b in batches])
    for line, k in zip(lines[1:], plots.VERIFY_KS):
        assert f"K={k}" in line.get_label()
        close(line.get_ydata(), [run[b]["verify_ms"][k] for b in batches])
    assert costs["machine"]["gpu"] in fig.get_suptitle()


@pytest.mark.parametrize("figure, name", [("speedup.png", plots.HELDOUT),
                                          ("acceptance.png", plots.ACCEPTANCE),
                                          ("gpu_step_batch.png", plots.GPU_COSTS)])
def test_titles_name_the_machine_and_the_date(figures, figure, name):
    fig, result = figures[figure], load(name)
    machine = result["machine"].get("gpu") or result["machine"]["cpu"]
    assert machine in fig.get_suptitle()
    date = result.get("date", name)[:10]
    assert date in texts(fig)
