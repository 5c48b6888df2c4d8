"""The benchmarks' arithmetic and markdown, no server (part of `make test`)."""
import json
import math
from pathlib import Path

import pytest

import bench
import draft_schedules
import figures
import make_random_pair
import report
import server
import triton_runs


def test_percentile_matches_numpy_linear():
    np = pytest.importorskip("numpy")
    v = [5.0, 1.0, 3.0, 2.0, 10.0, 7.0]
    for q in (0, 50, 90, 99, 100):
        assert math.isclose(figures.percentile(v, q), float(np.percentile(v, q)))
    assert figures.percentile([], 50) is None


def test_theoretical_speedup():
    # a = 0.8, K = 4, c = 0.05 (Leviathan et al.: about 2.8x)
    s = figures.theoretical_speedup(0.8, 0.05, 4)
    assert math.isclose(s, (1 - 0.8 ** 5) / (0.2 * 1.2))
    assert figures.theoretical_speedup(1.0, 0.0, 4) == 5.0
    assert figures.theoretical_speedup(0.0, 0.0, 4) == 1.0
    assert figures.theoretical_speedup(0.5, 0.3, 0) == 1.0


def test_itl_splits_each_gap_over_its_tokens():
    r = figures.Req(0, 6, 1.0, 0.1, [0.1, 0.4, 0.5], [1, 3, 2])
    assert r.itl() == pytest.approx([0.1, 0.1, 0.1, 0.05, 0.05])
    s = figures.latency_summary([r])
    assert s["output_tokens"] == 6 and s["tokens_per_s"] == 6.0 and s["ttft_p50_s"] == 0.1


def test_presets_and_scale():
    full = make_random_pair.PRESETS["llama-8b"]
    params = sum(math.prod(s) for _, s in make_random_pair.tensor_shapes(full))
    assert 8.0e9 < params < 8.1e9                     # Llama-3.1-8B: 8.03 B
    one = make_random_pair.PRESETS["llama-1b"]
    params = sum(math.prod(s) for _, s in make_random_pair.tensor_shapes(one))
    assert 1.2e9 < params < 1.3e9                     # Llama-3.2-1B: 1.24 B (tied)
    small = make_random_pair.scaled(full, 0.0625, None)
    assert small["num_hidden_layers"] == 2 and small["head_dim"] == 128
    assert small["num_attention_heads"] % small["num_key_value_heads"] == 0
    assert small["hidden_size"] == small["num_attention_heads"] * small["head_dim"]


def test_triton_split_puts_the_rest_of_the_call_outside_queue_and_compute():
    before = {server.TARGET: {"count": 10, "queue": 0, "compute_input": 0, "compute_infer": 0,
                             "compute_output": 0}}
    after = {server.TARGET: {"count": 14, "queue": 4e6, "compute_input": 1e6,
                            "compute_infer": 20e6, "compute_output": 1e6}}
    # 4 timed calls of 8 ms each: 1 ms queue + 5.5 ms compute + 1.5 ms elsewhere
    (v,) = server.triton_split(before, after, {server.TARGET: (0.032, 4)}).values()
    assert v["calls"] == 4 and v["triton_requests"] == 4
    assert v["call_s"] == pytest.approx(0.008)
    assert v["queue_s"] == pytest.approx(0.001)
    assert v["compute_s"] == pytest.approx(0.0055)
    assert v["rest_s"] == pytest.approx(0.0015)
    assert server.triton_split(before, after, {server.TARGET: (0.0, 0)}) == {}


def test_draft_schedules_replay_rounds_exactly():
    # Two positions' records are enough to follow the path: at 0 the draft matches the target
    # for 3 tokens, at 4 for 1; every other position matches nothing.
    none = ([0.9] * 4, [0] * 4)
    rows = [([0.9, 0.9, 0.3, 0.9], [1, 1, 1, 0])] + [none] * 3 + [([0.9] * 4, [1, 0, 0, 0])] + \
        [none] * 3

    def fixed(k):
        return lambda s, c: k

    def no_update(s, a, k):
        return None

    # K=4: round 1 accepts 3 (+1 own token) -> position 4; accepts 1 -> 6; then 1 per round.
    assert draft_schedules.replay([rows], 8, fixed(4), no_update) == (8, 4, 16)
    # K=2: accepts 2 -> 3; 0 -> 4; 1 -> 6; 0 -> 7; 0 -> 8.
    assert draft_schedules.replay([rows], 8, fixed(2), no_update) == (8, 5, 10)

    def by_confidence(s, conf):  # stop after the first draft token below 0.5
        return next((j + 1 for j, c in enumerate(conf) if c < 0.5), 4)
    # Drafts 3 at position 0 (the third is unsure) and accepts all 3.
    assert draft_schedules.replay([rows], 8, by_confidence, no_update)[:2] == (8, 4)


def test_markdown_is_what_the_stored_run_printed():
    # bench.py prints the markdown made from the report it writes as JSON; the tables are what
    # people compare runs by, so a change to them is deliberate: then name a run made after it.
    run = Path(__file__).parent / "results" / "2026-11-22g-cpu-default"
    printed = run.with_suffix(".md").read_text()
    assert report.markdown(json.loads(run.with_suffix(".json").read_text())) == printed


def test_command_line_defaults_and_quick():
    full = bench.parse_args([])
    assert (full.prompts, full.max_tokens, full.ks, full.concurrency) == (64, 64, [1, 2, 4, 6, 8],
                                                                          [1, 4, 16])
    assert not full.prompts_explicit and full.server_env == {}
    quick = bench.parse_args(["--quick", "--ks", "4,0,2", "--server-env", "SPECDEC_SPEC_OFF_AT=65"])
    assert (quick.prompts, quick.max_tokens, quick.ks, quick.concurrency) == (4, 32, [2, 4], [1, 4])
    assert quick.server_env == {"SPECDEC_SPEC_OFF_AT": "65"}
    with pytest.raises(SystemExit):
        bench.parse_args(["--server-env", "K=4"])


def test_metric_deltas_to_acceptance_and_rounds():
    # 10 rounds drafted 40 tokens and accepted 30: 4 tokens a round (3 accepted + the target's).
    d = {"specdec_rounds_total": 10.0, "specdec_draft_tokens_total": 40.0,
         "specdec_accepted_tokens_total": 30.0}
    assert server.acceptance_rate(d) == 0.75
    assert server.tokens_per_round(d) == 4.0
    assert server.drafted_per_round(d) == 4.0
    target_only = {"specdec_rounds_total": 8.0}
    assert server.acceptance_rate(target_only) is None
    assert server.tokens_per_round(target_only) == 1.0
    assert server.drafted_per_round({}) is None
    assert server.metric_delta({"a": 1.0}, {"a": 3.0, "b": 2.0}) == {"a": 2.0, "b": 2.0}


def test_concurrency_row_aggregates_over_the_wall_time():
    reqs = [figures.Req(i, 10, 1.0, 0.1, [0.1, 0.5], [5, 5]) for i in range(4)]
    d = {"specdec_rounds_total": 20.0, "specdec_draft_tokens_total": 40.0,
         "specdec_accepted_tokens_total": 20.0}
    row = triton_runs.concurrency_row("triton K=2", 2, 4, reqs, 2.0, d)
    assert row["tokens_per_s"] == 10.0                  # per stream: 40 tokens / 4 s busy
    assert row["aggregate_tokens_per_s"] == 20.0        # 40 tokens / 2 s wall
    assert (row["acceptance_rate"], row["mean_k_drafted"], row["rounds"]) == (0.5, 2.0, 20.0)


def test_random_head_and_the_costs_script_on_a_scaled_pair(tmp_path, capsys):
    """make_random_pair --head writes a speculators head the engine loads beside its target (the
    published Llama-3.1-8B head's draft vocabulary, aux layers, width), and costs.py measures
    every figure it reports on that pair: what a lent GPU will run, at a CPU's size."""
    import costs
    import torch
    from specdec.proposers.eagle.checkpoint import load_head
    from specdec.runtime.weights import load_model

    pair = tmp_path / "rp"
    assert make_random_pair.main(["--out", str(pair), "--scale", "0.0625", "--head"]) == 0
    cfg = json.loads((pair / "eagle" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 32000
    model = load_model(str(pair / "target"), torch.float32, torch.device("cpu"))
    head = load_head(pair / "eagle", model, torch.float32, torch.device("cpu"))
    assert head.fc.in_features == 3 * model.args.hidden_size
    assert head.lm_head.weight.shape == (32000, model.args.hidden_size)

    out = tmp_path / "costs.json"
    assert costs.main(["--pair", str(pair), "--batches", "1,2", "--ks", "1,3", "--context", "24",
                       "--calls", "2", "--warmup", "1", "--threads", "1", "--prefill", "40,64",
                       "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert list(runs) == ["CUDA graphs off"]
    for b in ("1", "2"):
        r = runs["CUDA graphs off"][b]
        assert r["step_ms"] > 0 and set(r["verify_steps"]) == {"1", "3"}
        assert all(v > 0 for v in r["propose_ms"].values())
        assert all(v > 0 for v in r["head_verify_ms"].values())
        assert {"draft_per_token_steps", "head_per_token_steps"} <= set(r)
        assert set(r["implied"]["draft"]) == {"0.6", "0.7", "0.8"}
        assert set(r["implied"]["head"]) == {"2.5", "3.0", "3.5"}
    prefill = runs["CUDA graphs off"]["1"]["prefill_ms"]   # longer than the rows' context
    assert set(prefill) == {"40", "64"} and all(v > 0 for v in prefill.values())
    printed = capsys.readouterr().out
    assert "head: fixed + per token" in printed and "implied (not measured)" in printed
    assert "prefill, one prompt alone: 40 tokens" in printed


def test_costs_times_swift_and_medusa_inside_the_verification(tmp_path, capsys):
    """--self-skip and --medusa-heads: each in-target drafter's verification of K that also
    drafts K (Medusa's K no more than its heads), its line over K and the speedups it implies."""
    import costs

    out = tmp_path / "costs.json"
    assert costs.main(["--batches", "1,2", "--ks", "1,3", "--context", "16", "--calls", "1",
                       "--warmup", "0", "--threads", "1", "--draft", "none", "--head", "none",
                       "--self-skip", "1-2", "--medusa-heads", "2", "--json", str(out)]) == 0
    for r in json.loads(out.read_text())["runs"]["CUDA graphs off"].values():
        assert set(r["self_verify_ms"]) == {"1", "3"} and set(r["medusa_verify_ms"]) == {"1"}
        assert all(v > 0 for v in r["self_verify_ms"].values())
        assert {"self_per_token_steps", "medusa_per_token_steps"} <= set(r)
        assert set(r["implied"]) == {"self", "medusa"}
        assert r["implied"]["medusa"]["0.8"]["k"] == 1
    with pytest.raises(SystemExit):
        costs.main(["--draft", "none", "--head", "none", "--self-skip", "0"])
    assert "--self-skip='0': layer 0 is never skipped" in capsys.readouterr().err


def test_compare_plans_the_load_part_at_the_streams_and_k_asked(tmp_path):
    import compare

    args = compare.parse_args(["--scenarios", "hybrid", "--load-streams", "4",
                               "--load-ks", "2,4,6"])
    _, _, steps, _ = compare.plans("hybrid", args, tmp_path)
    load = [(s.label, n) for s, n in steps if n != 1]
    assert load == [("target-only", 4), ("hybrid auto", 4), ("hybrid K=2", 4),
                    ("hybrid K=4", 4), ("hybrid K=6", 4)]
    _, _, steps, _ = compare.plans("hybrid", compare.parse_args([]), tmp_path)
    assert {n for _, n in steps} == {1, 16}
    assert [s.k for s, n in steps if n == 16] == [0, compare.AUTO, 2, 4]
    with pytest.raises(SystemExit):
        compare.parse_args(["--load-ks", "4,x"])


def test_compare_plans_self_and_medusa_with_their_server_settings(tmp_path):
    import compare

    args = compare.parse_args(["--self-skip", "1,3", "--medusa", str(tmp_path)])
    _, env, steps, _ = compare.plans("self", args, tmp_path)
    assert env == {"SPECDEC_SELF_SKIP": "1,3"}
    assert [(s.label, n) for s, n in steps] == [
        ("target-only", 1), ("self auto", 1), ("self K=2", 1), ("self K=4", 1),
        ("target-only", 16), ("self auto", 16), ("self K=2", 16), ("self K=4", 16)]
    _, env, steps, _ = compare.plans("medusa", args, tmp_path)
    assert env == {"SPECDEC_MEDUSA_HEADS": str(tmp_path)}
    assert {s.proposer for s, _ in steps if s.k} == {"medusa"}
    with pytest.raises(SystemExit, match="--medusa HEADS"):
        compare.plans("medusa", compare.parse_args([]), tmp_path)


def test_compare_reads_acceptance_by_position_from_the_counters_deltas():
    import compare

    before = ({"1": 10.0, "2": 4.0, "3": 0.0}, {"1": 5.0, "2": 1.0})
    after = ({"1": 30.0, "2": 14.0, "3": 0.0}, {"1": 15.0, "2": 3.0, "3": 0.0})
    # position 1: 10 accepted of 20 drafted; 2: 2 of 10; 3 never drafted in the setting
    assert compare.by_position(before, after) == [0.5, 0.2]


def test_cpu_by_process_table_sums_the_processes_and_counts_busy_cores():
    run = json.loads((Path(__file__).parent / "results" / "2026-11-22g-cpu-default.json")
                     .read_text())
    first = run["single_stream"][0]
    first["cpu_s_per_token"] = {"speculative_decoding": 0.004, "tritonserver": 0.001,
                                "client": 0.0005}
    first["tokens_per_s"] = 200.0              # 5 ms a token
    printed = report.markdown(run)
    head = "| setting | speculative_decoding | tritonserver | client | all |"
    assert head in printed
    row = next(line for line in printed.splitlines()
               if line.startswith(f"| {first['setting']} | 4.0 "))
    assert row.endswith("| 4.0 | 1.0 | 0.5 | 5.5 | 5.0 | 1.10 |")


def test_a_server_stopped_while_it_starts_takes_its_processes_with_it(tmp_path, monkeypatch):
    """A SIGTERM (exit_on_sigterm's SystemExit) or ^C while the server starts: nobody holds
    the Server yet, so the constructor stops the process group it started itself."""
    import os
    import subprocess
    started = []
    real_popen = subprocess.Popen

    def popen(cmd, **kw):   # a stand-in for the launcher, in a session of its own as it is
        started.append(real_popen(["sleep", "60"], start_new_session=True,
                                  stdout=kw.get("stdout"), stderr=kw.get("stderr")))
        return started[-1]

    def interrupted(self):
        raise SystemExit(143)
    monkeypatch.setattr(server.subprocess, "Popen", popen)
    monkeypatch.setattr(server.Server, "_ready", interrupted)
    target = Path(__file__).resolve().parents[1] / "models" / "default"
    with pytest.raises(SystemExit):
        server.Server(target / "target", target / "draft", max_seq_len=64, workdir=tmp_path)
    [proc] = started
    assert proc.wait(timeout=10) is not None   # killed, not left to run its minute
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)


def test_thread_cpu_is_read_by_the_os_name_the_courier_gives_its_thread():
    """courier_load.py finds the courier by the name courier.py gives its thread for the OS."""
    import os
    import threading
    import time

    from specdec.serving import courier

    def spin():
        courier._name_os_thread("specdec-test")
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        done.wait()

    done = threading.Event()
    t = threading.Thread(target=spin)
    t.start()
    try:
        deadline = time.monotonic() + 5
        while server.thread_cpu_s(os.getpid(), "specdec-test") < 0.04:
            assert time.monotonic() < deadline, "no CPU read for the named thread"
            time.sleep(0.01)
        assert server.thread_cpu_s(os.getpid(), "no-such-thread") == 0
    finally:
        done.set()
        t.join()
