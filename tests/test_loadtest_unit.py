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
