"""Served at simulated GPU step times: the same requests in process (specdec.decoding.local + the
loop) and through a real tritonserver (the ensemble over gRPC streaming), every engine call padded
to the time a cost table gives for it on an H100 (specdec/hooks/simulate.py; the default table is
derived by benchmarks/sim_tables.py, docs/simulated.md). The tiny models still choose the tokens, so
acceptance is real; the gap between the two sides is what the server's orchestration costs a GPU
deployment.

Per sampling mode, stream count and setting (target-only, the draft model at K and auto, the
EAGLE-3 head at K): tok/s in process and served, served / in process, each side's time per
round of one sequence (its requests' seconds over their rounds) and the overhead per round
(served less in process), split into the draft call, the verify call and what lies outside the
calls (the orchestrator, pre/postprocessing, gRPC), from the server's own latency histograms;
BLS calls per round by proposer (specdec_bls_calls_per_round, since the server started); and
the tokens an in-target drafter drafted a round ahead that their round did not verify, a round.

    .venv/bin/python benchmarks/simulated.py --quick             # a fast check (minutes)
    .venv/bin/python benchmarks/simulated.py --prompts 8 --max-tokens 64 --out /tmp/sim.json
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from inputs import load_prompts, load_tokenizer
from machine import git_state, load_snapshot, machine
from progress import log
from pyspy import Profiler
from server import default_max_seq_len, exit_on_sigterm
from sim_plan import parse
from sim_report import cpu_table, row, start_table, table


def _run_group(args, prompts, texts, local, servers: dict, results: dict, n, named: bool,
               spy: Profiler, gateway=None):
    """Each setting in process and served back to back (a server idles while this process
    computes), so a change of load on the machine touches both sides alike; with several
    placements, the draft model's on each server in turn (every setting on one whose target is
    hosted: auto, orchestrator). named: the placement in every label (servers in turn).
    gateway: `specdec openai` in front of the first server, every setting through it as well."""
    for mode in args.mode_list:
        for streams in args.stream_counts:
            for s in args.setting_list:
                local_r = None
                # The warm-up reaches the run's batch shapes (CUDA graphs are captured the
                # first time a shape comes): at least one request a stream, as many streams
                warm = max(args.warmup, streams)
                if local:
                    local.run(prompts[:warm], s, mode, args.max_tokens, streams)
                    with spy.record(f"local-{mode.name}-x{streams}-{s.label}",
                                    {"local": os.getpid()}):
                        local_r = local.run(prompts[:n(streams)], s, mode, args.max_tokens,
                                            streams)
                # The draft model's placements differ for the draft alone; the target's
                # (hosted or in target_model) for every setting.
                on = [(p, v) for i, (p, v) in enumerate(servers.items())
                      if s.proposer == "draft" or i == 0 or v.hosted]
                for placement, server in on or [(None, None)]:
                    label = s.label if len(on) < 2 and not named else f"{s.label} ({placement})"
                    r = results.setdefault((mode.name, streams, label), {})
                    if local_r:
                        r["local"] = local_r
                    if server:
                        import sim_served
                        sim_served.run(server, texts[:warm], s, mode, args.max_tokens, streams)
                        with spy.record(f"served-{mode.name}-x{streams}-{label}",
                                        _spied(server)):
                            r["served"] = sim_served.run(server, texts[:n(streams)], s, mode,
                                                         args.max_tokens, streams)
                    if gateway and server is next(iter(servers.values())):
                        r = results.setdefault((mode.name, streams, f"{label} via OpenAI"), {})
                        if local_r:
                            r["local"] = local_r
                        sim_served.run(server, texts[:warm], s, mode, args.max_tokens, streams,
                                       gateway)
                        r["served"] = sim_served.run(server, texts[:n(streams)], s, mode,
                                                     args.max_tokens, streams, gateway)


SPIED = ("speculative_decoding", "postprocessing")


def _spied(server) -> dict[str, int]:
    """The served run's Python processes: the client's streams, the loop, the detokenizer."""
    from specdec.launcher import procs
    found = procs.server_processes(server.proc.pid)
    return {"client": os.getpid(), **{m: found[m] for m in SPIED if m in found}}


def main(argv=None) -> int:
    args = parse(argv, __doc__)
    exit_on_sigterm()
    # The run's simulated device: its lock file, shared by both sides' engines (docs/simulated.md)
    args.device_dir = Path(tempfile.mkdtemp(prefix="specdec-sim-device-"))
    streams_max = max(args.stream_counts)
    texts = load_prompts(args.prompts_file, max(args.prompts, streams_max))
    tok = load_tokenizer(args.target)
    prompts = [(tok(t)["input_ids"], t) for t in texts]
    max_seq_len = default_max_seq_len(args.target, args.draft)

    def n(streams: int) -> int:
        """Prompts a run sends: --prompts, and at least one per stream."""
        return max(args.prompts, streams)
    results = {}     # (mode, streams, label) -> {"local": ..., "served": ...}
    local = None
    # Every placement's server at once, or (--servers-in-turn) one after another
    groups = [[p] for p in args.placement_list] if args.servers_in_turn else \
        [args.placement_list]
    try:
        if args.only in ("both", "local"):
            import sim_inproc
            local = sim_inproc.Local(args, streams_max, max_seq_len)
        for group in groups:
            servers = {}     # placement -> Server
            gateway = None   # `specdec openai` in front of the first
            try:
                if args.only in ("both", "served"):
                    import sim_served
                    for placement in group:
                        servers[placement] = sim_served.start(args, streams_max, max_seq_len,
                                                              placement)
                    if args.gateway:
                        first = next(iter(servers.values()))
                        gateway = sim_served.Gateway(first.grpc_url, first.workdir, first.env)
                _run_group(args, prompts, texts, local, servers, results, n,
                           named=len(groups) > 1, spy=Profiler(args.py_spy, args.profile_dir),
                           gateway=gateway)
            finally:
                if gateway:
                    gateway.stop()
                for server in servers.values():
                    server.stop()
    finally:   # stopped early (a timeout's SIGTERM, ^C): what was measured, still reported
        _report(args, results)
    return 0


def _report(args, results: dict) -> None:
    import sim_inproc
    rows = [row(mode, streams, label, r, args.scale)
            for (mode, streams, label), r in results.items()]
    print(f"{args.prompts} prompts (at least one per stream), {args.max_tokens} tokens, "
          f"{_device(args)}, draft on "
          f"{'a device of its own' if args.own_draft_device else 'the target device'} "
          f"(in process {'in' if sim_inproc.colocated(args) else 'apart from'} the target's "
          f"call), load {load_snapshot()['loadavg_1_5_15']}\n")
    print(table(rows))
    cpu = cpu_table(rows)
    if cpu:
        print(f"\nCPU ms per token by process, and cores busy\n\n{cpu}")
    start = start_table(rows)
    if start:
        print(f"\nA request's start, and postprocessing\n\n{start}")
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv, "machine": machine(),
                                        "git": git_state(), "rows": rows}, indent=1))
        log(f"wrote {args.out}")


def _device(args) -> str:
    if args.table is None:
        from specdec.serving.engine_settings import EngineSettings
        s = EngineSettings()
        device = s.torch_device()
        if device.type == "cuda":   # beside the server's own line (its log): the same cuDNN?
            from specdec.serving.checks import cuda_line
            device = cuda_line(device)
        return f"no table: {device}, {str(s.torch_dtype()).removeprefix('torch.')}"
    return f"table {args.table.name} x {args.scale:g}"


if __name__ == "__main__":
    sys.exit(main())
