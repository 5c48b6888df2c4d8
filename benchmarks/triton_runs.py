"""The server side of a benchmark run: every K single-stream (tokens/s, the round split, Triton's
own per-call statistics), then N concurrent streams for target-only and the best K.

For another comparison on a server of its own (other SPECDEC_* settings):

    with Server(env=settings) as server:
        reqs, wall_s, d = concurrency_run(server, prompts, k, streams, max_tokens, label)
        row = concurrency_row(label, k, streams, reqs, wall_s, d)
"""
from __future__ import annotations

import time
from dataclasses import asdict

from clients import run_requests, server_request
from figures import Req, latency_summary, speedup_model
from progress import log
from server import (DRAFT, TARGET, Server, acceptance_rate, drafted_per_round, settle_metrics,
                    tokens_per_round, triton_split)


def setting_name(k: int) -> str:
    return "triton target-only" if k == 0 else f"triton K={k}"


def measured_run(server: Server, prompts: list[tuple[int, str]], k: int, max_tokens: int,
                 streams: int, label: str) -> tuple[list[Req], float, dict]:
    """Requests through `streams` streams: (requests, wall seconds, the server's metric deltas
    over them)."""
    before = server.metrics()
    reqs, wall = run_requests(server.grpc_url, prompts, k, max_tokens, streams, label)
    return reqs, wall, settle_metrics(server, before, sum(r.tokens for r in reqs))


def single_stream(server: Server, prompts: list[tuple[int, str]], ks: list[int], max_tokens: int,
                  warmup: int) -> tuple[list[dict], dict[int, int], dict[int, str]]:
    """Target-only, then each K, one request at a time. Returns the rows, and per prompt index
    the token count and text of the target-only run (what the other backends must reproduce)."""
    rows: list[dict] = []
    lengths: dict[int, int] = {}
    k0_texts: dict[int, str] = {}
    k0_verify = None
    for k in [0] + ks:
        label = setting_name(k)
        for j in range(warmup):
            server_request(server.grpc_url, prompts[j % len(prompts)][1], -1, k, max_tokens)
        stats_before, cpu_before = server.model_stats(), server.cpu_seconds()
        client_before = time.process_time()
        reqs, _, d = measured_run(server, prompts, k, max_tokens, 1, label)
        client_s = time.process_time() - client_before
        stats_after, cpu_after = server.model_stats(), server.cpu_seconds()
        row = {"setting": label, "k": k, "backend": "triton", **latency_summary(reqs)}
        rounds = d.get("specdec_rounds_total", 0)
        drafted = d.get("specdec_draft_tokens_total", 0)
        draft_sum = d.get("specdec_draft_latency_seconds_sum", 0)
        draft_count = d.get("specdec_draft_latency_seconds_count", 0)
        verify_sum = d.get("specdec_verify_latency_seconds_sum", 0)
        verify_count = d.get("specdec_verify_latency_seconds_count", 0)
        if k == 0:
            k0_verify = verify_sum / verify_count
            for r in reqs:
                lengths[r.prompt_index] = r.tokens
                k0_texts[r.prompt_index] = r.text
        else:
            row["acceptance_rate"] = acceptance_rate(d)
            row["c"] = (draft_sum / drafted) / k0_verify if drafted else None
            row["same_text_as_k0"] = sum(r.text == k0_texts.get(r.prompt_index) for r in reqs)
        row["tokens_per_round"] = tokens_per_round(d)
        row["output_tokens_metric"] = d.get("specdec_output_tokens_total")
        row["finish_reasons"] = sorted({str(r.finish_reason) for r in reqs})
        wall = sum(r.total_s for r in reqs)
        row["round"] = {"rounds": int(rounds), "wall_s": wall / rounds,
                        "drafted_per_round": drafted / rounds,
                        "draft_s": draft_sum / rounds, "verify_s": verify_sum / rounds,
                        "overhead_s": (wall - draft_sum - verify_sum) / rounds,
                        "verify_call_s": verify_sum / verify_count,
                        "draft_call_s": draft_sum / draft_count if draft_count else None,
                        "verify_vs_k0": (verify_sum / verify_count) / k0_verify}
        row["bls_split"] = triton_split(stats_before, stats_after, {
            DRAFT: (draft_sum, draft_count), TARGET: (verify_sum, verify_count)})
        tokens = sum(r.tokens for r in reqs)
        # Where a served token's CPU goes, by process: on a host with few cores the server's
        # other processes take the cores the engine's thread would have had.
        row["cpu_s_per_token"] = {**{name: (cpu_after.get(name, 0.0) - cpu) / tokens
                                     for name, cpu in cpu_before.items()},
                                  "client": client_s / tokens}
        row["metric_deltas"] = d
        row["per_request"] = [{**asdict(r), "text": None} for r in reqs]
        rows.append(row)
        log(f"{label}: {row['tokens_per_s']:.1f} tok/s"
            + (f", a={row['acceptance_rate']:.3f}, c={row['c']:.3f}" if k else ""))
    for row in rows:
        k = row["k"]
        row["speedup"] = row["tokens_per_s"] / rows[0]["tokens_per_s"]
        if k and row["acceptance_rate"] is not None and row["c"] is not None:
            row.update(speedup_model(row["speedup"], row["acceptance_rate"], row["c"], k,
                                     row["tokens_per_round"]))
    return rows, lengths, k0_texts


def best_k(single: list[dict]) -> int | None:
    """The K of the fastest speculative single-stream row."""
    spec = [r for r in single if r["k"]]
    return max(spec, key=lambda r: r["tokens_per_s"])["k"] if spec else None


def concurrency_run(server: Server, prompts: list[tuple[int, str]], k: int, streams: int,
                    max_tokens: int, label: str) -> tuple[list[Req], float, dict]:
    """`streams` concurrent requests to warm up, then max(len(prompts), streams) requests (the
    prompts repeated) through `streams` streams."""
    n = max(len(prompts), streams)
    batch = [(i, prompts[i % len(prompts)][1]) for i in range(n)]
    warm = [(i, prompts[i % len(prompts)][1]) for i in range(streams)]
    log(f"{label}: warm-up ({streams} concurrent requests)")
    run_requests(server.grpc_url, warm, k, max_tokens, streams, f"{label} warm-up", False)
    return measured_run(server, batch, k, max_tokens, streams, label)


def concurrency_row(label: str, k: int, streams: int, reqs: list[Req], wall: float,
                    d: dict) -> dict:
    s = latency_summary(reqs)
    return {"setting": label, "k": k, "concurrency": streams, **s,
            "aggregate_tokens_per_s": s["output_tokens"] / wall, "wall_s": wall,
            "acceptance_rate": acceptance_rate(d), "rounds": d.get("specdec_rounds_total"),
            "mean_k_drafted": drafted_per_round(d)}


def concurrency(server: Server, prompts: list[tuple[int, str]], ks: list[int],
                streams: list[int], max_tokens: int, single: list[dict]) -> list[dict]:
    """Aggregate throughput per K and number of streams; one stream reuses the single-stream
    row."""
    rows = []
    for k in ks:
        label = setting_name(k)
        for c in streams:
            if c == 1:
                src = next(r for r in single if r["k"] == k)
                rows.append({"setting": label, "k": k, "concurrency": 1,
                             "requests": src["requests"], "output_tokens": src["output_tokens"],
                             "aggregate_tokens_per_s": src["tokens_per_s"],
                             **{x: src[x] for x in ("tokens_per_s", "ttft_p50_s", "ttft_p99_s",
                                                    "itl_p50_s", "itl_p99_s")},
                             "acceptance_rate": src.get("acceptance_rate"),
                             "mean_k_drafted": src["round"]["drafted_per_round"],
                             "note": "the single-stream run"})
                continue
            reqs, wall, d = concurrency_run(server, prompts, k, c, max_tokens, f"{label} x{c}")
            rows.append(concurrency_row(label, k, c, reqs, wall, d))
            log(f"{label} x{c}: {rows[-1]['aggregate_tokens_per_s']:.1f} tok/s aggregate")
    return rows
