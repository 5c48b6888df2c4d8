"""The Prometheus metrics agree with the per-request statistics returned to clients."""
from specdec_client import GenerationParams, generate, generate_stream
from tests.e2e.conftest import heldout_prompts

COUNTERS = ("specdec_draft_tokens_total", "specdec_accepted_tokens_total",
            "specdec_output_tokens_total", "specdec_rounds_total")
HISTOGRAM_COUNTS = ("specdec_time_to_first_token_seconds_count",
                    "specdec_request_acceptance_rate_count", "specdec_round_latency_seconds_count")


def snapshot(server) -> dict[str, float]:
    names = COUNTERS + HISTOGRAM_COUNTS
    snap = {n: server.metric(n) for n in names}
    for reason in ("length", "eos", "stop"):
        snap[reason] = server.metric("specdec_requests_total", finish_reason=reason)
    for j in (1, 2, 3, 4):
        snap[f"acc{j}"] = server.metric("specdec_accepted_at_position_total", position=str(j))
        snap[f"dr{j}"] = server.metric("specdec_drafted_at_position_total", position=str(j))
    return snap


def test_metrics_add_up_to_the_per_request_statistics(server):
    prompts = heldout_prompts(4)
    before = snapshot(server)
    results = [generate(server.http, p, GenerationParams(max_tokens=24, num_draft_tokens=k))
               for p, k in zip(prompts, (4, 2, 0, 3))]
    stream = generate_stream(server.http, prompts[0], GenerationParams(
        max_tokens=24, temperature=0.9, seed=3, num_draft_tokens=4))
    list(stream)
    results.append(stream.result)
    after = snapshot(server)
    d = {k: after[k] - before[k] for k in after}

    assert d["specdec_draft_tokens_total"] == sum(r.total_draft_tokens for r in results)
    assert d["specdec_accepted_tokens_total"] == sum(r.total_accepted_draft_tokens for r in results)
    assert d["specdec_output_tokens_total"] == sum(r.num_output_tokens for r in results)
    total = sum(r.num_output_tokens for r in results)
    assert total / 5 <= d["specdec_rounds_total"] <= total  # at most K+1 tokens a round
    by_reason = {}
    for r in results:
        by_reason[r.finish_reason] = by_reason.get(r.finish_reason, 0) + 1
    for reason in ("length", "eos", "stop"):
        assert d[reason] == by_reason.get(reason, 0)
    # Per-position counters: position j is drafted in every round with K >= j; they add up.
    assert sum(d[f"dr{j}"] for j in (1, 2, 3, 4)) == d["specdec_draft_tokens_total"]
    assert sum(d[f"acc{j}"] for j in (1, 2, 3, 4)) == d["specdec_accepted_tokens_total"]
    assert all(d[f"acc{j}"] <= d[f"dr{j}"] for j in (1, 2, 3, 4))
    assert d["dr1"] >= d["dr2"] >= d["dr3"] >= d["dr4"]
    assert d["specdec_time_to_first_token_seconds_count"] == len(results)
    assert d["specdec_request_acceptance_rate_count"] == 4  # the requests that drafted
    assert d["specdec_round_latency_seconds_count"] == d["specdec_rounds_total"]
