"""benchmarks/simulated.py's plan, arguments and report, and sim_tables.py's derivation; no
server, no timing (part of `make test`)."""
import json

import pytest

import sim_plan
import sim_report
import sim_tables


def test_default_plan():
    args = sim_plan.parse([])
    assert args.stream_counts == [1, 4, 16]
    assert [m.name for m in args.mode_list] == ["greedy", "sampled"]
    assert [(s.label, s.proposer, s.k) for s in args.setting_list] == [
        ("target-only", None, 0), ("draft K=4", "draft", 4),
        ("draft auto", "draft", sim_plan.AUTO), ("eagle K=4", "eagle", 4),
        ("eagle auto", "eagle", sim_plan.AUTO)]
    assert args.table.is_file() and args.head.is_dir() and args.scale == 1.0
    assert sim_plan.parse(["--scale", "4"]).scale == 4.0
    assert sim_plan.parse(["--table", "none"]).table is None and not args.servers_in_turn


def test_no_table_loads_the_engines_as_the_server_does_and_runs_them_unpadded():
    """--table none: the server's default device and dtype (here the CPU, float32), nothing
    padded, nothing counted against a table."""
    import sim_inproc
    import torch
    args = sim_plan.parse(["--table", "none"])
    local = sim_inproc.Local(args, 2, 128)
    assert not hasattr(local.target, "simulated") and not hasattr(local.draft, "simulated")
    assert local.target.dtype == local.draft.dtype == torch.float32
    tok = sim_plan.Setting("target-only", None, 0)
    r = local.run([([5, 17, 200, 33], "a prompt")], tok, args.mode_list[0], 6, 1)
    assert r["tokens"] == 6 and r["rounds"] == 6 and r["calls"] == 0
    assert r["target_execution_s"] is None
    # The draft drafts inside the target's call, as the served default places it.
    from specdec.records import Proposer
    assert local.colocated and local.drafter is None and Proposer.DRAFT in local.target.drafters
    r = local.run([([5, 17, 200, 33], "a prompt")], sim_plan.Setting("draft K=4", "draft", 4),
                  args.mode_list[0], 12, 1)
    assert r["tokens"] == 12 and r["drafted"] > 0 and r["rounds"] < 12
    apart = sim_inproc.Local(sim_plan.parse(["--table", "none", "--placements", "separate"]),
                             2, 128)
    assert not apart.colocated and apart.drafter is not None
    assert Proposer.DRAFT not in apart.target.drafters


def test_quick_and_refusals():
    args = sim_plan.parse(["--quick", "--k", "3"])
    assert (args.prompts, args.max_tokens, args.stream_counts) == (2, 16, [1, 2])
    assert [m.temperature for m in args.mode_list] == [0.0]
    assert args.setting_list[1].label == "draft K=3"
    for bad in (["--modes", "greedy,hot"], ["--streams", "0"], ["--k", "9"], ["--scale", "0"]):
        with pytest.raises(SystemExit):
            sim_plan.parse(bad)


def test_seeds_are_the_prompts():
    assert sim_plan.seed_of("def f():") == sim_plan.seed_of("def f():")
    assert sim_plan.seed_of("def f():") != sim_plan.seed_of("def g():")


def side(tokens, wall, request_s, rounds, draft_s, verify_s):
    return {"tokens": tokens, "wall_s": wall, "request_s": request_s, "rounds": rounds,
            "draft_s": draft_s, "verify_s": verify_s}


def test_report_splits_the_overhead():
    local = {**side(100, 1.0, 1.0, 50, 0.3, 0.5), "target_execution_s": 0.01, "discarded": 0}
    served = {**side(100, 1.25, 1.25, 50, 0.35, 0.6), "bls_calls_per_round": {"draft": 2.0},
              "target_batch": 1.5, "target_batch_sizes": {1: 2, 2: 1},
              "target_execution_s": 0.0125, "discarded": 25}
    r = sim_report.row("greedy", 1, "draft K=4", {"local": local, "served": served})
    assert r["ratio"] == pytest.approx(0.8)
    ov = r["overhead_ms"]
    assert ov["round_ms"] == pytest.approx(5.0)
    assert ov["draft_ms"] + ov["verify_ms"] + ov["outside_ms"] == pytest.approx(5.0)
    assert ov["draft_ms"] == pytest.approx(1.0)
    assert r["projected_ratio_x1"] == pytest.approx(r["local"]["round_ms"] / (
        r["local"]["round_ms"] + 5.0))
    # At a table x 4 the same overhead weighs four times as much at x1.
    r4 = sim_report.row("greedy", 1, "draft K=4", {"local": local, "served": served}, 4.0)
    assert r4["projected_ratio_x1"] == pytest.approx(5.0 / (5.0 + 5.0))
    # The head drafts inside the verify call: its draft seconds are not a call of their own.
    e = sim_report.row("greedy", 1, "eagle K=4", {"local": local, "served": served})
    assert e["local"]["draft_ms"] == 0.0
    text = sim_report.table([r, e])
    # BLS calls a round; drafts discarded a round in process, served (an in-target drafter's)
    assert "| greedy | 1 | draft K=4 |" in text
    assert "| 2.00 | 0.00 | 0.50 | 1.50 | 1:2 2:1 |" in text
    assert "| 1:2 2:1 | 10.0 | 12.5 |" in text   # a target execution's ms: in process, served
    # Calls whose real compute outran the table, each side: a share and ms a call past it.
    local["calls_over_table"], local["calls"], local["over_s"] = 1, 50, 0.01
    served.update(calls_over_table=10, calls=50, over_s=0.1)
    o = sim_report.row("greedy", 1, "draft K=4", {"local": local, "served": served})
    assert o["served_calls_over_table"] == pytest.approx(0.2)
    assert o["served_past_table_ms"] == pytest.approx(2.0)
    assert sim_report.table([o]).endswith("| 2 % | 20 % | 0.20 | 2.00 |")
    # CPU by process: ms a token each side, and the cores each side kept busy.
    local["cpu_s"] = {"in process": 0.5}
    served["cpu_s"] = {"speculative_decoding": 0.6, "client": 0.2, "tritonserver": 0.1}
    c = sim_report.row("greedy", 16, "target-only", {"local": local, "served": served})
    assert c["cpu_ms_per_token"]["served"]["speculative_decoding"] == pytest.approx(6.0)
    cpu = sim_report.cpu_table([c])
    assert "| in process | client | speculative_decoding | tritonserver | served, all |" in cpu
    # 0.5 s of 1.0 s in process; 0.9 s of 1.25 s served
    assert cpu.endswith("| 16 | target-only | 5.00 | 2.00 | 6.00 | 1.00 | 9.00 | 0.50 | 0.72 |")
    assert sim_report.cpu_table([o]) == ""   # a run that took none
    # Read back from JSON, the sizes are text keys.
    assert sim_report._sizes({"3": 4, "1": 5}) == "1:5 3:4" and sim_report._sizes(None) == "-"


def test_report_splits_a_requests_start_from_its_rounds():
    """Two requests a side: served each took 0.125 s more, 0.1 of it before the first token;
    postprocessing's wait and time a response from Triton's sums."""
    local = {**side(100, 1.0, 1.0, 50, 0.3, 0.5), "requests": 2, "ttft_s": 0.02}
    served = {**side(100, 1.25, 1.25, 50, 0.35, 0.6), "requests": 2, "ttft_s": 0.12,
              "bls_calls_per_round": {},
              "postprocessing": {"responses": 100, "queue_s": 0.2, "busy_s": 0.05}}
    r = sim_report.row("greedy", 16, "target-only", {"local": local, "served": served})
    assert r["ttft_ms"] == pytest.approx({"local": 20.0, "served": 120.0})
    assert r["start_share"] == pytest.approx(0.8)
    assert r["postprocessing_ms"] == pytest.approx({"queue": 2.0, "busy": 0.5})
    assert sim_report.start_table([r]).endswith(
        "| 16 | target-only | 20.0 | 120.0 | 80 % | 2.00 | 0.50 |")
    # A run from before these fields (or in process only): no table, no share.
    old = sim_report.row("greedy", 1, "target-only", {
        "local": side(1, 1, 1, 1, 0, 1), "served": {**side(1, 1, 1, 1, 0, 1),
                                                    "bls_calls_per_round": {}}})
    assert sim_report.start_table([old]) == "" and "start_share" not in old


def test_no_projection_below_minus_the_x1_round():
    """An overhead below minus the in-process round at x1 (a CPU-paced in-process side) would
    project a negative or infinite served round: no figure, n/a."""
    local = side(100, 1.0, 1.0, 10, 0.3, 0.5)            # 100 ms a round, 25 at x1
    served = {**side(100, 0.6, 0.6, 10, 0.2, 0.3), "bls_calls_per_round": {}}   # -40 ms
    r = sim_report.row("sampled", 4, "draft auto", {"local": local, "served": served}, 4.0)
    assert r["overhead_ms"]["round_ms"] == pytest.approx(-40.0)
    assert r["projected_ratio_x1"] is None
    assert "| n/a |" in sim_report.table([r])
    # Just above: a figure again (25 / (25 - 20)).
    served = {**side(100, 0.8, 0.8, 10, 0.2, 0.3), "bls_calls_per_round": {}}
    r = sim_report.row("sampled", 4, "draft auto", {"local": local, "served": served}, 4.0)
    assert r["projected_ratio_x1"] == pytest.approx(5.0)


def test_derived_tables_match_their_checks(tmp_path):
    t = sim_tables.derived("both", 512)
    assert t["simulated"] is True and "SIMULATED" in t["device"]
    ms = t["batches"]["1"]["step_ms"]
    assert 0.9 < ms / sim_tables.CHECKS["target step"][0] < 1.1
    assert 1.0 <= t["batches"]["1"]["propose_ms"]["1"] <= 1.5
    assert t["batches"]["16"]["step_ms"] > ms        # more rows read more KV
    sim_tables.write(t, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text())["batches"]["1"]["step_ms"] == ms


def test_a_table_from_costs_output(tmp_path):
    costs = {"device": "Some GPU", "dtype": "bfloat16", "target": "t", "draft": "d",
             "head": "none", "context": 256,
             "runs": {"CUDA graphs off": {"1": {"step_ms": 9.0, "verify_ms": {"4": 9.5}}},
                      "CUDA graphs on": {"1": {"step_ms": 7.0, "verify_ms": {"4": 7.5},
                                               "propose_ms": {"4": 4.0},
                                               "verify_steps": {"4": 1.07}}},
                      "CUDA graphs on, invariant": {"1": {"step_ms": 12.0,
                                                          "verify_ms": {"4": 12.5}}}}}
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(costs))
    t = sim_tables.from_costs(path, [0.03, 0.005], None)
    assert t["batches"]["1"] == {"step_ms": 7.0, "verify_ms": {"4": 7.5}, "propose_ms": {"4": 4.0}}
    # The invariance is the target's: the draft's proposals come from the run without it.
    t = sim_tables.from_costs(path, [0.03, 0.005], "CUDA graphs on, invariant")
    assert t["batches"]["1"] == {"step_ms": 12.0, "verify_ms": {"4": 12.5},
                                 "propose_ms": {"4": 4.0}}
    assert t["prefill_ms_per_token"] == {"target": 0.03, "draft": 0.005}
    sim_tables.write(t, tmp_path / "table.json")


def test_the_gateway_client_sends_the_modes_temperature_and_the_prompts_seed():
    from types import SimpleNamespace

    from sim_served import SampledOpenAIClient
    gateway = SimpleNamespace(url="http://127.0.0.1:9", model="target")   # never connected
    greedy = SampledOpenAIClient(gateway, sim_plan.Mode("greedy", 0.0))
    sampled = SampledOpenAIClient(gateway, sim_plan.Mode("sampled", 0.7))
    try:
        body = greedy.body("Once", 4, 16, "draft")
        assert (body["temperature"], body["num_draft_tokens"], body["proposer"]) == (0.0, 4,
                                                                                    "draft")
        assert "seed" not in body and body["stream"] is True
        body = sampled.body("Once", -1, 16, None)
        assert (body["temperature"], body["seed"]) == (0.7, sim_plan.seed_of("Once"))
        assert "proposer" not in body   # absent: the server's default proposer
    finally:
        greedy.close()
        sampled.close()

