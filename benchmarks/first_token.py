"""Where a served request's first token goes: Triton's own trace (`--trace-config
level=TIMESTAMPS`) of one-token requests sent one at a time to the ensemble over gRPC
streaming, as a timeline from the moment tritonserver has read the request: preprocessing,
speculative_decoding's execute (which starts the generation and returns), the response's arrival
at postprocessing, the gRPC send. Beside it the engine's prefill (the round's verification, from
the server's metrics) and the client's time to first token. A one-token request's only response
is also its last, which the request's counts (metrics) go ahead of; the same prompts then run
for --max-tokens tokens, whose first response is an ordinary streamed one.

    .venv/bin/python benchmarks/first_token.py [--prompts 32] [--max-tokens 64]
                                               [--target DIR --draft DIR]

On a GPU host the same command shows what the server adds to a prefill there; on this CPU the
prefill is the engine's own slow compute.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from clients import run_requests
from inputs import DEFAULT_PROMPTS, add_pair_arguments, load_prompts
from progress import log
from server import Server, exit_on_sigterm, settle_metrics

# (label, model, Triton's timestamp), in the order a request passes them; model None: the
# ensemble's own (its gRPC request).
STAGES = (
    ("preprocessing queued", "preprocessing", "QUEUE_START"),
    ("preprocessing done", "preprocessing", "REQUEST_END"),
    ("speculative_decoding received", "speculative_decoding", "REQUEST_START"),
    ("speculative_decoding's execute returned", "speculative_decoding", "COMPUTE_END"),
    ("first response at postprocessing", "postprocessing", "REQUEST_START"),
    ("postprocessing done", "postprocessing", "REQUEST_END"),
    ("gRPC send started", None, "GRPC_SEND_START"),
    ("gRPC send ended", None, "GRPC_SEND_END"),
)


def timelines(trace: list[dict]) -> list[dict[str, float]]:
    """Each ensemble request's STAGES in ms after GRPC_WAITREAD_END (tritonserver has read it),
    from Triton's trace file (a list of {"id", "model_name", "parent_id"} and {"id",
    "timestamps"} entries), in the order they arrived; the first postprocessing request is the
    first response's."""
    models: dict[int, dict] = {}
    stamps: dict[int, dict[str, int]] = {}
    for entry in trace:
        if "model_name" in entry:
            models[entry["id"]] = entry
        for t in entry.get("timestamps", []):
            stamps.setdefault(entry["id"], {}).setdefault(t["name"], t["ns"])
    out = []
    for root, entry in models.items():
        if entry.get("parent_id") is not None or "GRPC_WAITREAD_END" not in stamps.get(root, {}):
            continue
        children: dict[str, dict[str, int]] = {}
        for i, child in models.items():
            if child.get("parent_id") == root and i in stamps:
                seen = children.get(child["model_name"])
                if seen is None or stamps[i]["REQUEST_START"] < seen["REQUEST_START"]:
                    children[child["model_name"]] = stamps[i]
        t0 = stamps[root]["GRPC_WAITREAD_END"]
        try:
            out.append((t0, {label: ((children[model] if model else stamps[root])[name] - t0)
                             / 1e6 for label, model, name in STAGES}))
        except KeyError:   # a request the trace did not follow through every model
            continue
    return [timeline for _, timeline in sorted(out, key=lambda x: x[0])]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_pair_arguments(ap)
    ap.add_argument("--prompts-file", type=Path, default=DEFAULT_PROMPTS)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64,
                    help="the second set's tokens a request (0: one-token requests only)")
    ap.add_argument("--out", type=Path, help="also write every request's timeline as JSON")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    prompts = load_prompts(args.prompts_file, args.prompts)
    workdir = Path(tempfile.mkdtemp(prefix="specdec-first-token-"))
    trace_file = workdir / "trace.json"   # written as the server stops
    with Server(args.target, args.draft, 1, workdir=workdir, args=(
            f"--trace-config=triton,file={trace_file}", "--trace-config=level=TIMESTAMPS",
            "--trace-config=rate=1", "--trace-config=count=-1")) as server:
        run_requests(server.grpc_url, list(enumerate(prompts[:args.warmup])), 0, 1, 1,
                     "warm-up", progress=False)
        before = server.metrics()
        reqs, _ = run_requests(server.grpc_url, list(enumerate(prompts)), 0, 1, 1,
                               "first token", progress=False)
        d = settle_metrics(server, before, sum(r.tokens for r in reqs))
        sets = [reqs]
        if args.max_tokens > 1:
            sets.append(run_requests(server.grpc_url, list(enumerate(prompts)), 0,
                                     args.max_tokens, 1, f"{args.max_tokens} tokens",
                                     progress=False)[0])
    verify = (d["specdec_verify_latency_seconds_sum"]
              / d["specdec_verify_latency_seconds_count"] * 1e3)
    traced = timelines(json.loads(trace_file.read_text()))[args.warmup:]
    log(f"{len(traced)} requests traced")
    n = len(prompts)
    columns = [("one-token request", traced[:n], sets[0])]
    if len(sets) > 1:
        columns.append((f"{args.max_tokens}-token request", traced[n:], sets[1]))
    print("| stage, ms after tritonserver read the request (median) | "
          + " | ".join(name for name, _, _ in columns) + " |\n|---|"
          + "---:|" * len(columns))
    for label, _, _ in STAGES:
        print(f"| {label} | " + " | ".join(
            f"{statistics.median(r[label] for r in rows):.2f}" for _, rows, _ in columns) + " |")
    print("| the client's time to first token | " + " | ".join(
        f"{statistics.median(r.ttft_s * 1e3 for r in rs):.2f}" for _, _, rs in columns) + " |")
    print(f"\nThe engine's prefill (a one-token request's verification, mean): {verify:.2f} ms")
    if args.out:
        args.out.write_text(json.dumps({"argv": sys.argv, "verify_ms": verify, "columns": {
            name: {"ttft_ms": [r.ttft_s * 1e3 for r in rs], "timelines": rows}
            for name, rows, rs in columns}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
