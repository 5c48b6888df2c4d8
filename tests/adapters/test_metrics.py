"""specdec.serving.metrics: counters are summed and sent in batches, histograms at once."""
import asyncio

from specdec.planning.planner import Estimates
from specdec.records import Finish, Round, Stats
from specdec.serving import metrics as metrics_module
from specdec.serving.metrics import Metrics
from tests.adapters import fake_pb


class Counting:
    """Counts the updates a fake metric receives: each would be one message to the server."""

    def __init__(self, monkeypatch):
        self.calls = 0
        for name in ("increment", "observe"):
            real = getattr(fake_pb.Metric, name)

            def wrapped(metric, value, real=real):
                self.calls += 1
                real(metric, value)
            monkeypatch.setattr(fake_pb.Metric, name, wrapped)


def value(name, **labels):
    (m,) = fake_pb.metrics(name, model="batching_test", **labels)
    return m.value()


def test_counters_are_sent_when_the_request_finishes(monkeypatch):
    m = Metrics(fake_pb, "batching_test", max_draft_tokens=8)
    sent = Counting(monkeypatch)
    for _ in range(10):
        m.round(Round(k=8, accepted=5, draft_s=0.01, verify_s=0.01))
        m.tokens(6, 0.02, first=False)
    assert value("specdec_rounds_total") == 0           # nothing sent yet
    assert sent.calls == 10 * 5                         # 4 histograms a round + ITL
    m.finished("length", Stats(num_output_tokens=60, total_draft_tokens=80,
                               total_accepted_draft_tokens=50, rounds=10))
    assert value("specdec_rounds_total") == 10
    assert value("specdec_draft_tokens_total", proposer="draft") == 80
    assert value("specdec_accepted_tokens_total", proposer="draft") == 50
    assert value("specdec_draft_tokens_total", proposer="ngram") == 0
    assert value("specdec_output_tokens_total") == 60
    assert value("specdec_drafted_at_position_total", proposer="draft", position="8") == 10
    assert value("specdec_accepted_at_position_total", proposer="draft", position="5") == 10
    assert value("specdec_accepted_at_position_total", proposer="draft", position="6") == 0
    assert value("specdec_requests_total", finish_reason="length") == 1
    # Each round was a draft_model call and a target_model call.
    assert value("specdec_bls_calls_total", proposer="draft") == 20
    assert value("specdec_bls_calls_per_round", proposer="draft") == 2.0
    # One increment per counter that moved (rounds, BLS calls, drafted, accepted, output, 8 + 5
    # positions, the finish reason) and the acceptance histogram.
    assert sent.calls == 10 * 5 + 5 + 8 + 5 + 1 + 1


def test_a_round_with_the_head_is_one_bls_call():
    """The head drafts inside the target's call: one call a round, against two with the draft
    model; a round that drafted nothing is one call too."""
    m = Metrics(fake_pb, "eagle_test", max_draft_tokens=8)
    for _ in range(6):
        m.round(Round(k=4, accepted=3, draft_s=0.001, verify_s=0.01, proposer="eagle",
                      drafted=5))
    m.round(Round(k=2, accepted=1, draft_s=0.01, verify_s=0.01, proposer="draft"))
    m.round(Round(k=0, accepted=0, draft_s=0.0, verify_s=0.01, proposer="eagle",
                  in_target_failure="error"))
    # A lookup won a round the head had drafted 3 for; the head's 5 used 2 of them.
    m.round(Round(k=4, accepted=4, draft_s=0.0, verify_s=0.01, proposer="ngram", discarded=3,
                  ahead="eagle"))
    m.round(Round(k=2, accepted=2, draft_s=0.001, verify_s=0.01, proposer="eagle", drafted=5,
                  discarded=3, ahead="eagle"))
    m.flush()

    def of(name, **labels):
        (metric,) = fake_pb.metrics(name, model="eagle_test", **labels)
        return metric.value()
    assert of("specdec_bls_calls_per_round", proposer="eagle") == 1.0
    assert of("specdec_bls_calls_per_round", proposer="draft") == 2.0
    assert of("specdec_bls_calls_total", proposer="none") == 1
    assert of("specdec_draft_tokens_total", proposer="eagle") == 24 + 2
    assert of("specdec_accepted_at_position_total", proposer="eagle", position="3") == 6
    assert of("specdec_draft_failures_total", reason="error") == 1
    assert of("specdec_discarded_draft_tokens_total", proposer="eagle") == 6
    assert of("specdec_discarded_draft_tokens_total", proposer="draft") == 0


def test_long_requests_send_counters_while_they_run(monkeypatch):
    m = Metrics(fake_pb, "batching_test", max_draft_tokens=8)
    monkeypatch.setattr(metrics_module, "FLUSH_EVERY_S", 0.0)
    m.round(Round(k=2, accepted=1, draft_s=0.01, verify_s=0.01))
    assert value("specdec_rounds_total") == 1
    assert value("specdec_draft_tokens_total", proposer="draft") == 2


def test_lookup_rounds_count_under_their_proposer(monkeypatch):
    m = Metrics(fake_pb, "batching_test", max_draft_tokens=8)
    monkeypatch.setattr(metrics_module, "FLUSH_EVERY_S", 0.0)
    (draft_latency,) = fake_pb.metrics("specdec_draft_latency_seconds", model="batching_test")
    before = len(draft_latency.observations)
    m.round(Round(k=3, accepted=2, draft_s=1e-5, verify_s=0.01, proposer="ngram"))
    assert value("specdec_draft_tokens_total", proposer="ngram") == 3
    assert value("specdec_accepted_at_position_total", proposer="ngram", position="2") == 1
    assert value("specdec_draft_tokens_total", proposer="draft") == 0
    assert len(draft_latency.observations) == before     # a lookup is not a draft_model call


def test_a_final_response_follows_its_counts_and_precedes_the_estimates(serving, monkeypatch):
    """A client that reads the metrics after its answer sees its counts; the server's acceptance
    and cost estimates, a gauge a position and a part, follow the answer instead of delaying it
    (0.8 ms a final response on the 2-core CPU, docs/benchmarks.md)."""
    from tests.adapters.conftest import orchestrator_request, run_all
    from tests.adapters.responses import PROMPTS
    monkeypatch.setattr(metrics_module, "FLUSH_EVERY_S", 1e9)   # no periodic flush in between
    orch = serving.orchestrator()
    (estimate,) = fake_pb.metrics("specdec_acceptance_estimate", model="speculative_decoding",
                                  proposer="draft", position="1")
    at_final = {}

    def on_send(response, flags):
        if flags & fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            (tokens,) = fake_pb.metrics("specdec_output_tokens_total",
                                        model="speculative_decoding")
            at_final.update(tokens=tokens.value(), estimate=estimate.value())

    run_all(orch, [orchestrator_request(PROMPTS[0], on_send=on_send, max_tokens=8,
                                        num_draft_tokens=3)])
    assert at_final == {"tokens": 8, "estimate": 0}
    assert 0 < estimate.value() < 1   # sent once the answer had left


def test_request_ends_send_the_estimates_at_most_every_flush_interval(monkeypatch):
    """The estimates are 45 gauge updates at max_draft_tokens 8, each a message on the courier
    that every stream's responses share: a request's end sends them where FLUSH_EVERY_S has
    passed since they last went, else once it has, with the figures of that moment."""
    monkeypatch.setattr(metrics_module, "FLUSH_EVERY_S", 0.05)
    rate = [0.5]
    m = Metrics(fake_pb, "estimates_test", max_draft_tokens=8, estimates=lambda: Estimates(
        {"draft": [rate[0]] * 8}, {"verify_call": 0.01}))
    (gauge,) = fake_pb.metrics("specdec_acceptance_estimate", model="estimates_test",
                               proposer="draft", position="1")

    async def three_ends():
        for r in (0.5, 0.6, 0.7):
            rate[0] = r
            m.finished(Finish.LENGTH, None)
        assert gauge.history == [0.5]   # the first at once; the next two within 50 ms
        await asyncio.sleep(0.2)

    asyncio.run(three_ends())
    assert gauge.history == [0.5, 0.7]

    # A timer left on a loop that closed (the first asyncio.run's) does not hold them back on
    # the next loop.
    async def two_ends_on_one_loop_closed_before_due():
        for r in (0.8, 0.9):
            rate[0] = r
            m.finished(Finish.LENGTH, None)

    asyncio.run(two_ends_on_one_loop_closed_before_due())   # 0.8 at once, 0.9's timer dropped

    async def an_end_on_another_loop():
        rate[0] = 1.0
        m.finished(Finish.LENGTH, None)
        await asyncio.sleep(0.2)

    asyncio.run(an_end_on_another_loop())
    assert gauge.history == [0.5, 0.7, 0.8, 1.0]


def test_calls_per_round_is_sent_when_it_changes():
    m = Metrics(fake_pb, "calls_test", max_draft_tokens=8)
    (gauge,) = fake_pb.metrics("specdec_bls_calls_per_round", model="calls_test",
                               proposer="draft")
    for _ in range(3):
        m.round(Round(k=2, accepted=1, draft_s=0.01, verify_s=0.01))
        m.finished(Finish.LENGTH, None)
    assert gauge.history == [2.0]
