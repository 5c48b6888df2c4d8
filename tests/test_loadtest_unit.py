"""The load test's judgement of one finished request, without locust or a server."""
from __future__ import annotations

import pytest

from loadtest.outcome import NoTokens, check, stream_metrics
from specdec_client import Result


def result(**kw) -> Result:
    base = dict(text="ab", num_output_tokens=3, total_draft_tokens=8,
                total_accepted_draft_tokens=6, acceptance_rate=0.75, finish_reason="length",
                time_to_first_token_s=0.010, total_time_s=0.050, chunk_times_s=[0.010, 0.030, 0.050])
    base.update(kw)
    return Result(**base)


def test_a_full_answer_adds_every_stream_metric():
    r = result()
    check(r)
    got = stream_metrics(r, num_draft_tokens=4)
    kinds = [k for k, _, _ in got]
    assert kinds == ["TTFT", "TPOT", "ITL", "ITL", "TOK/S", "ACCEPT%"]
    values = dict((k, v) for k, v, _ in got if k != "ITL")
    assert values["TTFT"] == pytest.approx(10.0)
    assert values["TPOT"] == pytest.approx(20.0)  # (50 - 10) ms over 2 tokens after the first
    assert values["TOK/S"] == pytest.approx(60.0)
    assert values["ACCEPT%"] == pytest.approx(75.0)
    assert [v for k, v, _ in got if k == "ITL"] == pytest.approx([20.0, 20.0])
    assert "ACCEPT%" not in [k for k, _, _ in stream_metrics(r, num_draft_tokens=0)]


@pytest.mark.parametrize("reason", ["eos", "stop"])
def test_an_empty_answer_ending_on_eos_or_a_stop_word_is_correct(reason):
    # A sampled row may draw EOS first: the prefill round then commits nothing to show.
    r = result(text="", num_output_tokens=0, total_draft_tokens=0, total_accepted_draft_tokens=0,
               acceptance_rate=0.0, finish_reason=reason, time_to_first_token_s=None,
               chunk_times_s=[])
    check(r)
    assert stream_metrics(r, num_draft_tokens=4) == []


@pytest.mark.parametrize("kw", [
    dict(text="", num_output_tokens=0, chunk_times_s=[], time_to_first_token_s=None),
    dict(text="", chunk_times_s=[], time_to_first_token_s=None),  # tokens but no text
    dict(text="", num_output_tokens=None, chunk_times_s=[], finish_reason=None),
])
def test_an_empty_answer_for_any_other_reason_fails(kw):
    with pytest.raises(NoTokens, match="no output"):
        check(result(**kw))


def test_a_cancelled_request_must_end_cancelled_or_on_its_own():
    from loadtest.outcome import NotCancelled
    check(result(finish_reason="cancelled"), cancelled=True)
    check(result(finish_reason="length"), cancelled=True)    # it ended before the cancel
    with pytest.raises(NotCancelled):
        check(result(finish_reason=None), cancelled=True)


def test_the_mix_cancels_its_share_of_requests_and_keeps_seeded_mixes():
    import random

    from loadtest.prompts import Mix
    plain = [Mix(["p"], [4], 8, rng=random.Random(3)).next() for _ in range(50)]
    same = [Mix(["p"], [4], 8, rng=random.Random(3), cancel_ratio=0.0).next() for _ in range(50)]
    assert plain == same and not any(p.cancel_after for p in plain)
    mix = Mix(["p"], [4], 8, rng=random.Random(1), cancel_ratio=0.1)
    plans = [mix.next() for _ in range(2000)]
    share = sum(1 for p in plans if p.cancel_after) / len(plans)
    assert 0.07 < share < 0.13
    assert {p.cancel_after for p in plans if p.cancel_after} == {1, 2, 3, 4}
    with pytest.raises(ValueError):
        Mix(["p"], [4], 8, cancel_ratio=1.5)


def test_soak_slope_and_problems():
    from loadtest.soak import problems, slope_per_min
    assert slope_per_min([(0, 100.0), (10, 100.5), (20, 101.0)]) == pytest.approx(3.0)
    assert slope_per_min([(0, 100.0)]) == 0.0
    good = {"locust_exit": 0, "requests": 10, "failures": 0, "leaked_slots": {"draft_model": 0, "target_model": 0},
            "active_sequences_after": 0, "model_restarts": {"draft_model": 0, "target_model": 0},
            "restarted_processes": [], "memory": {"target_model": {"slope_mib_per_min": 1.0}}}
    assert problems(good) == []
    bad = {**good, "failures": 2, "leaked_slots": {"draft_model": 1, "target_model": 0},
           "memory": {"target_model": {"slope_mib_per_min": 5.0}}}
    found = problems(bad)
    assert len(found) == 3 and "unexpected failures" in found[0] and "target_model" in found[2]
    assert problems(bad, slope_limit=10.0)[-1].startswith("slots")
    wander = {**good, "memory": {"target_model": {"slope_mib_per_min": 20.0},
                                 "tritonserver": {"slope_mib_per_min": 12.0}}}
    assert problems(wander, 10.0, 30.0) == ["tritonserver: memory grows 12.0 MiB/min"]
    assert len(problems(wander, 10.0)) == 2 and len(problems(wander, 15.0, 25.0)) == 0
    assert problems({**good, "locust_exit": "did not stop"})[0].startswith("locust exited")
