"""gRPC clients that go away abruptly, on a real tritonserver of its own under the launcher.

Triton 2.51 (nvidia-pytriton) may crash under them: Triton's own gRPC stream handling, fixed
upstream in 2.53, 2.57 and 2.68 (docs/reliability.md). What the project guarantees is that the
service comes back: the launcher restarts a server that dies (specdec/launcher/keeper.py), no
request hangs, and exact output returns within a bound. The fuzz and soak tests close their
streams cleanly; abrupt disconnects are this module's job.
"""
from __future__ import annotations

import pytest

from loadtest.storm import markdown, storm
from specdec_client import GenerationParams, generate, grpc_stream
from tests.e2e.conftest import heldout_prompts, launch, wait_for

STORM_S = 20
THREADS = 6
# A crash costs a restart (about 20 s on the 2-core CI machine, models reloaded) plus the
# monitor's first exact answer; 240 s is several restarts on a busy machine.
RECOVERY_BOUND_S = 240.0


@pytest.fixture(scope="module")
def storm_server(tmp_path_factory):
    yield from launch(tmp_path_factory)


def cancelled(s) -> float:
    try:
        return s.metric("specdec_requests_total", finish_reason="cancelled")
    except KeyError:   # no request has finished yet
        return 0.0


def test_an_explicit_grpc_cancel_releases_its_sequence(storm_server):
    """A client of the ensemble that cancels ends its generation at its next round (finish
    reason cancelled: postprocessing forwards the cancellation, orchestrator.py), where
    Triton alone would let it run to max_tokens holding its slot."""
    s = storm_server
    prompt = heldout_prompts(1)[0]
    before = cancelled(s)
    # The draft model drafts (its slot must be freed too), without lookups: the default
    # target's loops, drafted in full by a lookup, could end 1000 tokens before the cancel.
    stream = grpc_stream(s.grpc, prompt,
                         GenerationParams(max_tokens=1000, num_draft_tokens=4, proposer="draft"))
    next(iter(stream))
    assert s.metric("specdec_active_sequences") == 1
    stream.cancel()
    assert list(stream) == [] and stream.result is not None
    assert stream.result.finish_reason == "cancelled"
    assert wait_for(lambda: cancelled(s) == before + 1, 30)
    assert wait_for(lambda: s.metric("specdec_active_sequences") == 0)
    assert wait_for(lambda: s.metric("specdec_kv_slots_used", model="target_model") == 0)
    assert s.metric("specdec_kv_slots_used", model="draft_model") == 0
    assert generate(s.http, prompt, GenerationParams(max_tokens=4)).num_output_tokens == 4


def test_the_service_survives_a_disconnect_storm(storm_server):
    """Concurrent clients, with and without the triton_grpc_error header, cut short streams
    mid-stream, right after an error and right after the first response: every request ends
    (answered, an error or cancelled; none hangs), every crash is restarted by the launcher
    with its cause logged, and exact output comes back within the bound with no slot held."""
    s = storm_server
    r = storm(s.http, s.grpc, s.metrics, s.pid, s.log, STORM_S, THREADS, header="half",
              timeout=60.0, recovery_bound_s=RECOVERY_BOUND_S)
    print("\n" + markdown(r))
    assert r["hangs"] == 0 and r["stuck_threads"] == 0, r
    assert r["abrupt_disconnects"] >= 100, r   # the storm did storm
    for ending in ("cancel-mid", "after-error", "after-first", "clean"):
        for header in ("header", "plain"):
            assert any(k.startswith(f"{ending} {header} ") for k in r["by_ending"]), r
    for crash in r["crashes"]:
        assert crash["cause"].startswith(("signal", "exit code")), crash
    assert r["exact_again_after_storm_s"] is not None, r
    assert r["problems"] == [], r
