"""specdec.hooks.simulate: engine calls padded to a cost table's times, the tables, their
refusals."""
import copy
import json
import time
from pathlib import Path

import pytest
import torch

from specdec.hooks import simulate
from specdec.records import Request
from tests.core.conftest import engines, generate

ROOT = Path(__file__).resolve().parents[2]
TABLES = [ROOT / "benchmarks" / "sim" / name for name in ("h100-8b-1b.json", "h100-8b-eagle.json")]


def table_data(step_ms=20.0) -> dict:
    ks = {str(k): step_ms * (1 + 0.05 * k) for k in range(1, 5)}
    return {"format": simulate.FORMAT, "device": "test device",
            "prefill_ms_per_token": {"target": 0.5, "draft": 0.1},
            "batches": {str(b): {"step_ms": step_ms * (1 + 0.1 * b),
                                 "verify_ms": {k: v * (1 + 0.1 * b) for k, v in ks.items()},
                                 "propose_ms": {k: step_ms / 4 * int(k) for k in ks}}
                        for b in (1, 4)}}


@pytest.mark.parametrize("path", TABLES, ids=lambda p: p.name)
def test_derived_tables_load_and_give_their_own_figures(path):
    data = json.loads(path.read_text())
    t = simulate.load_table(path)
    assert data["simulated"] is True and "SIMULATED" in t.device
    row = data["batches"]["4"]
    assert t.seconds(simulate.VERIFY, 4, 1, 4) == pytest.approx(row["verify_ms"]["4"] / 1e3)
    assert t.seconds(simulate.VERIFY, 4, 1, 0) == pytest.approx(row["step_ms"] / 1e3)
    # The public batch-1 figure: an 8B step about 6.3 ms (SGLang's 158 tok/s).
    assert 5.5e-3 < t.seconds(simulate.VERIFY, 1, 1, 0) < 7e-3
    # Between batch sizes: between their costs.
    lo, hi = t.seconds(simulate.VERIFY, 2, 1, 4), t.seconds(simulate.VERIFY, 4, 1, 4)
    assert lo <= t.seconds(simulate.VERIFY, 3, 1, 4) <= hi
    # A prompt past the table's k is a prefill: a step plus its tokens.
    pre = data["prefill_ms_per_token"]["target"]
    assert t.seconds(simulate.VERIFY, 1, 200, 0) == pytest.approx(
        (data["batches"]["1"]["step_ms"] + 200 * pre) / 1e3)


def test_head_and_draft_parts():
    draft = simulate.load_table(TABLES[0])
    head = simulate.load_table(TABLES[1])
    assert 0.5e-3 < draft.seconds(simulate.PROPOSE, 1, 1, 1) < 1.5e-3     # one 1B step
    assert draft.seconds(simulate.PROPOSE, 1, 1, 4) > 3 * draft.seconds(simulate.PROPOSE, 1, 1, 1)
    assert 0 < head.seconds(simulate.HEAD, 1, 1, 1) < 1e-3                # one head step
    assert head.seconds(simulate.HEAD, 1, 1, 0) == 0.0
    assert not head.has("propose_ms") and not draft.has("head_verify_ms")


@pytest.mark.parametrize("edit, field", [
    (lambda d: d["batches"]["1"].pop("step_ms"), "batches.1.step_ms"),
    (lambda d: d["batches"]["4"]["verify_ms"].update({"2": -1}), "batches.4.verify_ms.2"),
    (lambda d: d["batches"]["1"].pop("verify_ms"), "batches.1.verify_ms"),
    (lambda d: d["batches"].update({"x": {}}), "key 'x'"),
    (lambda d: d["batches"]["4"].pop("propose_ms"), "batches.1.propose_ms"),
    (lambda d: d["prefill_ms_per_token"].pop("draft"), "prefill_ms_per_token.draft"),
    (lambda d: d.update(format="v0"), "format"),
    (lambda d: d.update(batches={}), "batches"),
    (lambda d: d.update(runs={}), "costs.py"),
])
def test_a_bad_table_is_refused_naming_the_field(tmp_path, edit, field):
    data = table_data()
    edit(data)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    with pytest.raises(simulate.TableError, match=field.replace(".", r"\.")):
        simulate.load_table(path)


def test_a_draft_needs_propose_costs(pair_dir):
    data = table_data()
    for row in data["batches"].values():
        row.pop("propose_ms")
    t = simulate.parse_table(data)
    _, draft = engines(pair_dir, torch.float32, 4, 64)
    with pytest.raises(simulate.TableError, match="propose_ms"):
        simulate.pad(draft, t, "draft")


def test_padded_calls_take_their_table_time_and_change_no_token(pair_dir):
    t = simulate.parse_table(table_data(step_ms=20.0))
    plain_target, plain_draft = engines(pair_dir, torch.float32, 4, 64)
    target, draft = engines(pair_dir, torch.float32, 4, 64)
    simulate.pad(target, t, "target")
    simulate.pad(draft, t, "draft")
    reqs = [Request([1, 2, 3, 4], 12, 3), Request([5, 6, 7], 12, 3)]
    t0 = time.perf_counter()
    got = generate(target, draft, reqs)
    wall = time.perf_counter() - t0
    want = generate(plain_target, plain_draft, reqs)
    assert [g[0] for g in got] == [w[0] for w in want]
    ts, ds = target.simulated, draft.simulated
    assert ts.calls > 0 and ds.calls > 0
    assert ts.by_kind == {simulate.VERIFY: ts.calls}
    # Every call lasted at least its table time; the run at least all of them in sequence
    # (the two requests' calls are batched together, one call at a time in this process).
    assert ts.simulated_s >= ts.calls * t.seconds(simulate.VERIFY, 1, 1, 0)
    assert wall >= ts.simulated_s + ds.simulated_s


def test_one_call_lasts_at_least_its_time(pair_dir):
    from specdec.records import ProposeCall
    from specdec.runtime.sampling import SamplingParams
    t = simulate.parse_table(table_data(step_ms=40.0))
    _, draft = engines(pair_dir, torch.float32, 4, 64)
    simulate.pad(draft, t, "draft")
    want = t.seconds(simulate.PROPOSE, 2, 3, 2)
    t0 = time.perf_counter()
    out = draft.propose([ProposeCall(1, 0, [1, 2, 3], 2, SamplingParams()),
                         ProposeCall(2, 0, [4, 5], 2, SamplingParams())])
    assert time.perf_counter() - t0 >= want
    assert [len(p.tokens) for p in out] == [2, 2]


def test_from_env(pair_dir, tmp_path, capsys):
    target, _ = engines(pair_dir, torch.float32, 4, 64)
    assert simulate.from_env(target, "target", {}) is target
    assert not hasattr(target, "simulated")
    assert simulate.from_env(None, "draft", {simulate.ENV: str(TABLES[0])}) is None
    simulate.from_env(target, "target", {simulate.ENV: str(TABLES[0])})
    assert target.simulated.calls == 0
    assert "SIMULATED" in capsys.readouterr().err
    with pytest.raises(simulate.TableError, match="cannot read"):
        simulate.from_env(target, "target", {simulate.ENV: str(tmp_path / "none.json")})


def test_a_served_engine_publishes_its_calls_past_the_table(pair_dir, tmp_path, monkeypatch):
    """from_env (the served side) rewrites the engine's counts in $SPECDEC_SIMULATE_STATS,
    where simulated.py reads whether the server's compute outran the table; a table of 0.1 ms
    a step is outrun by every call of the real model."""
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table_data(step_ms=0.1)))
    target, draft = engines(pair_dir, torch.float32, 4, 64)
    simulate.from_env(target, "target", {simulate.ENV: str(path),
                                         simulate.STATS_ENV: str(tmp_path)})
    time.sleep(2 * simulate.PUBLISH_S)
    assert simulate.published(tmp_path)["calls"] == 0
    generate(target, draft, [Request([1, 2, 3], 6, 0)])
    time.sleep(3 * simulate.PUBLISH_S)
    got, ts = simulate.published(tmp_path), target.simulated
    assert got["calls"] == ts.calls >= 6 and got["over"] == ts.over == ts.calls
    assert got["over_s"] == pytest.approx(ts.over_s) and ts.over_s > 0
    assert 0 < ts.real_s - ts.over_s < ts.real_s   # the table's own times
    target.simulated_publisher.set()


def test_scale_multiplies_every_time(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(table_data()))
    one, three = simulate.load_table(path), simulate.load_table(path, 3.0)
    for call in ((simulate.VERIFY, 2, 1, 3), (simulate.PROPOSE, 4, 2, 2),
                 (simulate.VERIFY, 1, 90, 0)):
        assert three.seconds(*call) == pytest.approx(3 * one.seconds(*call))
    with pytest.raises(simulate.TableError, match="scale must be > 0"):
        simulate.load_table(path, 0)
    with pytest.raises(simulate.TableError, match="SPECDEC_SIMULATE_SCALE='x'"):
        simulate.from_env(object(), "target", {simulate.ENV: str(path), simulate.SCALE_ENV: "x"})


def test_table_data_is_not_shared():
    a = table_data()
    b = copy.deepcopy(a)
    simulate.parse_table(a)
    assert a == b    # parsing leaves the caller's object alone


class VirtualClock:
    """Compute takes no time, a sleep exactly its time: what a padded call costs, on any load."""
    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_colocated_draft_is_padded_inside_the_verification(pair_dir, monkeypatch):
    """The draft model in the target's process: its steps cost what draft_model's would, inside
    the verification that drafts (one call a round), and the tokens are the separate pair's."""
    from specdec.proposers.colocated import ColocatedDraft
    from specdec.records import Proposer
    clock = VirtualClock()
    monkeypatch.setattr(simulate, "time", clock)
    t = simulate.parse_table(table_data(step_ms=20.0))
    apart, draft = engines(pair_dir, torch.float32, 4, 64)
    target, inner = engines(pair_dir, torch.float32, 4, 64)
    target.add_drafter(Proposer.DRAFT, ColocatedDraft(inner))
    simulate.pad(target, t, "target")
    reqs = [Request([1, 2, 3, 4], 12, 3, proposer=Proposer.DRAFT)]
    got = generate(target, None, reqs)
    assert [g[0] for g in got] == [w[0] for w in generate(apart, draft, reqs)]
    ts, ds = target.simulated, inner.simulated
    assert ts.by_kind == {simulate.VERIFY: ts.calls} and ds.by_kind[simulate.PROPOSE] > 0
    # Each verification lasted its own time plus its draft's, in one call.
    assert clock.now == pytest.approx(ts.simulated_s)
    assert ts.simulated_s - ds.simulated_s >= ts.calls * t.seconds(simulate.VERIFY, 1, 1, 0)
    data = table_data()
    for row in data["batches"].values():
        row.pop("propose_ms")
    with pytest.raises(simulate.TableError, match="propose_ms"):
        simulate.pad(target, simulate.parse_table(data), "target")


# A process of its own: a draft engine padded through from_env (as draft_model and target_model
# are), its calls from a common start; prints each padded call's wall-clock interval.
_PADDED_PROCESS = r"""
import json, sys, time
from types import SimpleNamespace
from specdec.hooks import simulate
table, start, calls = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
spans = []
class Engine:
    def propose(self, batch):
        spans.append([time.time()])
        return [None for _ in batch]
engine = simulate.from_env(Engine(), "draft")
while time.time() < start:
    time.sleep(0.005)
for _ in range(calls):
    engine.propose([SimpleNamespace(tokens=[1], k=1)])
    spans[-1].append(time.time())
print(json.dumps(spans))
"""


def _padded_spans(tmp_path, shared: str, calls: int = 4) -> list[list[tuple[float, float]]]:
    import os
    import subprocess
    import sys
    data = table_data()
    for row in data["batches"].values():
        row["propose_ms"] = {"1": 150.0, "4": 150.0}     # 0.15 s a call
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))
    env = {**os.environ, simulate.ENV: str(path), simulate.SHARED_ENV: shared,
           "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    start = time.time() + 2.0     # both imported by then, on a loaded machine
    procs = [subprocess.Popen([sys.executable, "-c", _PADDED_PROCESS, str(path), str(start),
                               str(calls)], env=env, stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    out = [p.communicate(timeout=30)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return [[tuple(s) for s in json.loads(o)] for o in out]


def _overlap(a, b) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_two_processes_share_one_simulated_device(tmp_path):
    """draft_model and target_model on one GPU: their padded calls run one after another (the
    lock file in $TMPDIR); with SPECDEC_SIMULATE_SHARED=0, a device each, they overlap."""
    a, b = _padded_spans(tmp_path, "1")
    assert all(e - s >= 0.15 for s, e in a + b)
    # A call's end is read just after it gives the device up: a few ms of slack.
    assert _overlap(a, b) < 0.03
    assert (tmp_path / simulate.LOCK_NAME).exists()
    a, b = _padded_spans(tmp_path, "0")
    assert _overlap(a, b) > 0.3     # the negative control: four calls each, side by side
    with pytest.raises(simulate.TableError, match="SPECDEC_SIMULATE_SHARED='2'"):
        simulate.shared_device({simulate.SHARED_ENV: "2"})


def test_the_device_is_reentrant_in_a_process(tmp_path):
    """A co-located draft's calls hold the device inside the verification that holds it."""
    dev = simulate.Device(tmp_path / "lock")
    assert simulate.Device(tmp_path / "lock") is dev
    with dev.hold():
        with dev.hold():
            assert dev.depth == 2
    assert dev.depth == 0
