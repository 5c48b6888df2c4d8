"""What the benchmark writes besides its figures: how each figure is taken (the JSON's "method"),
and the markdown it prints, made from the JSON report alone."""
from __future__ import annotations

METHOD = {
    "server_timing": "client-side, gRPC streaming on tritonclient (one channel per "
                     "stream, one bidirectional stream per request), perf_counter from "
                     "before the request is sent to each response's callback",
    "tokens_per_s": "sum of output tokens / sum of request wall times (single stream)",
    "ttft": "request sent -> first response carrying output tokens",
    "itl": "per token: each gap between responses carrying tokens, divided by the "
           "tokens the later one carried (a round's tokens arrive together)",
    "hf_ttft": "from a timing streamer (first put after the prompt), same call as tok/s",
    "hf_lengths": "each prompt gets max_new_tokens = min_new_tokens = the token count the "
                  "server produced for it at K=0, so every setting emits the same tokens",
    "acceptance": "server metric deltas over the measured requests: a = accepted/drafted, "
                  "tokens/round = (accepted + rounds)/rounds",
    "c": "(draft_latency _sum / drafted tokens) / (verify_latency _sum/_count at K=0)",
    "theoretical_speedup": "S = (1 - a^(K+1)) / ((1 - a)(cK + 1))",
    "efficiency": "measured speedup over Triton target-only (tok/s ratio) / S",
    "round_split": "wall/round = client request time / rounds; draft and verify from the "
                   "latency histograms' _sum / rounds (each is one BLS call as the "
                   "orchestrator times it, transport included); overhead = wall - draft - "
                   "verify (orchestration, pre/postprocessing, ensemble, gRPC)",
    "engine": "specdec.runtime.engine + specdec.decoding.loop in this process "
              "(specdec.decoding.local drafter and verifier, no Triton), same prompts, K=0 "
              "and the best K: the compute share of the Triton calls; loop ms = wall - draft "
              "- verify",
    "cpu_by_process": "user + system CPU seconds of each server process (/proc/<pid>/stat, "
                      "stubs named by their model) and of this process (the client, "
                      "time.process_time) over each single-stream setting, per output token",
    "hf_assisted": "transformers assisted generation with its own defaults for the "
                   "number of draft tokens (see assistant_settings)",
}


def ms(x) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def num(x, fmt="{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}"


def table(heading: str, columns: list[str], text_columns: int, rows: list[list]) -> list[str]:
    """Lines of a markdown table under a heading (a blank line first): the first text_columns
    columns are left aligned, the figures after them right aligned."""
    return (["", f"### {heading}", "", "| " + " | ".join(columns) + " |",
             "|" + "---|" * text_columns + "---:|" * (len(columns) - text_columns)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def markdown(report: dict) -> str:
    """What the benchmark prints: the command, machine and settings, then the tables."""
    m, c = report["machine"], report["config"]
    return (f"## specdec benchmark, {report['date']}\n\n`{report['command']}`\n\n"
            f"Machine: {m.get('gpu') or m['cpu']} ({m['cpu_count']} CPUs), torch "
            f"{report['versions']['torch']}, transformers {report['versions']['transformers']}; "
            f"{c['device']} {c['dtype']}; {c['prompts']} prompts x {c['max_tokens']} tokens, "
            f"temperature 0; best K = {report.get('best_k')}; run took "
            f"{report['duration_s'] / 60:.1f} min.\n\n{tables(report)}\n")


def tables(report: dict) -> str:
    single = report["single_stream"]
    lines = table("Single stream", [
        "setting", "K", "tok/s", "speedup", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms",
        "ITL p99 ms", "a", "tokens/round", "c", "S (theory)", "efficiency",
        "S (measured tokens/round)"], 1, [
        [r["setting"], "-" if r["k"] is None else r["k"], num(r["tokens_per_s"], "{:.1f}"),
         num(r["speedup"]), ms(r["ttft_p50_s"]), ms(r["ttft_p99_s"]), ms(r["itl_p50_s"]),
         ms(r["itl_p99_s"]), num(r.get("acceptance_rate")), num(r.get("tokens_per_round")),
         num(r.get("c"), "{:.3f}"), num(r.get("theoretical_speedup")), num(r.get("efficiency")),
         num(r.get("speedup_model_measured_tokens"))] for r in single])[1:]
    rounds = [(r["setting"], r["round"]) for r in single if r.get("round")]
    lines += table("Time per round (server, single stream)", [
        "setting", "rounds", "drafted/round", "wall/round ms", "draft ms", "verify ms",
        "overhead ms", "draft %", "verify %", "overhead %", "verify / verify(K=0)"], 1, [
        [setting, s["rounds"], f"{s['drafted_per_round']:.2f}", ms(s["wall_s"]),
         ms(s["draft_s"]), ms(s["verify_s"]), ms(s["overhead_s"]), pct(s["draft_s"], s["wall_s"]),
         pct(s["verify_s"], s["wall_s"]), pct(s["overhead_s"], s["wall_s"]),
         num(s.get("verify_vs_k0"))] for setting, s in rounds])
    calls = [(r["setting"], m, v) for r in single for m, v in r.get("bls_split", {}).items()]
    if calls:
        lines += table("One BLS call, as the orchestrator and Triton time it (single stream)", [
            "setting", "model", "calls", "call ms", "queue ms", "compute ms", "rest ms"], 2, [
            [setting, model, v["calls"], ms(v["call_s"]), ms(v["queue_s"]), ms(v["compute_s"]),
             ms(v["rest_s"])] for setting, model, v in calls])
    cpu = [(r["setting"], r["cpu_s_per_token"], 1 / r["tokens_per_s"]) for r in single
           if r.get("cpu_s_per_token")]
    if cpu:
        names = sorted({n for _, c, _ in cpu for n in c if n != "client"}) + ["client"]
        lines += table("CPU ms per served token, by process (single stream)", [
            "setting", *names, "all", "wall ms per token", "cores busy"], 1, [
            [setting, *(ms(c.get(n)) for n in names), ms(sum(c.values())), ms(wall),
             f"{sum(c.values()) / wall:.2f}"] for setting, c, wall in cpu])
    if report.get("concurrency"):
        lines += table("Concurrency (server)", [
            "setting", "streams", "requests", "aggregate tok/s", "per-stream tok/s",
            "TTFT p50 ms", "ITL p50 ms", "a", "drafted/round"], 1, [
            [r["setting"], r["concurrency"], r["requests"],
             num(r["aggregate_tokens_per_s"], "{:.1f}"), num(r["tokens_per_s"], "{:.1f}"),
             ms(r["ttft_p50_s"]), ms(r["itl_p50_s"]), num(r.get("acceptance_rate")),
             num(r.get("mean_k_drafted"))] for r in report["concurrency"]])
    if report.get("engine"):
        lines += table("The same engine and loop in process, without Triton", [
            "setting", "tok/s", "TTFT p50 ms", "ITL p50 ms", "a", "tokens/round", "c",
            "S (theory)", "speedup vs its target-only", "efficiency", "drafted/round",
            "wall/round ms", "draft ms", "verify ms", "loop ms"], 1, [
            [r["setting"], num(r["tokens_per_s"], "{:.1f}"), ms(r["ttft_p50_s"]),
             ms(r["itl_p50_s"]), num(r.get("acceptance_rate")), num(r["tokens_per_round"]),
             num(r.get("c"), "{:.3f}"), num(r.get("theoretical_speedup")),
             num(r["speedup_vs_own_target_only"]), num(r.get("efficiency")),
             f"{r['round']['drafted_per_round']:.2f}", ms(r["round"]["wall_s"]),
             ms(r["round"]["draft_s"]), ms(r["round"]["verify_s"]), ms(r["round"]["overhead_s"])]
            for r in report["engine"]])
    m = report["memory"]
    kv = m["kv_pool_bytes"]
    lines += ["", "### Memory", "",
              f"- KV slot pool: target {kv['target'] / 2**20:.1f} MiB + draft "
              f"{kv['draft'] / 2**20:.1f} MiB = {kv['total'] / 2**20:.1f} MiB "
              f"({kv['max_sequences']} slots (+1 scratch) x {kv['max_seq_len']} tokens, "
              f"{kv['dtype']})",
              f"- tritonserver process tree peak RSS: "
              f"{m['server']['peak_rss_bytes'] / 2**20:.0f} MiB "
              f"sampled every 0.5 s ({m['server']['processes']} processes; sum of per-process "
              f"peaks {m['server']['sum_of_process_peak_rss_bytes'] / 2**20:.0f} MiB)"]
    return "\n".join(lines)
