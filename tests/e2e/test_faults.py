"""Faults, overload and dead processes on a real tritonserver of their own (docs/reliability.md).

One server for the module: two sequence slots, a one-second queue, the supervisor checking every
half second, the draft model in draft_model (a process of its own) as the only proposer, and a draft whose first calls fail by script
(specdec/hooks/faults.py), the target in target_model (SPECDEC_TARGET_PLACEMENT=separate: its
process can die alone). The tests run in file order: the script is used up by the first,
the last leaves the server broken.
"""
from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from specdec import names
from specdec.serving.probe import probe
from specdec_client import GenerationParams, ServerError, generate, generate_stream, grpc_stream
from tests.e2e.conftest import heldout_prompts, launch, post, wait_for

SLOTS = 2
FAULTS = "error*2,delay=3*1,unavailable*2"
PROMPTS = heldout_prompts(3)
DRAFT_BACK_WITHIN_S = 180.0


@pytest.fixture(scope="module")
def fault_server(tmp_path_factory):
    yield from launch(tmp_path_factory, {
        "SPECDEC_MAX_SEQUENCES": str(SLOTS), "SPECDEC_QUEUE_TIMEOUT_S": "1",
        "SPECDEC_HEALTH_INTERVAL_S": "0.5", "SPECDEC_DRAFT_TIMEOUT_S": "1",
        "SPECDEC_DRAFT_FAULT": FAULTS, "SPECDEC_DEFAULT_PROPOSER": "draft",
        "SPECDEC_DRAFT_PLACEMENT": "separate", "SPECDEC_TARGET_PLACEMENT": "separate"})


def greedy(k: int | None, max_tokens: int = 24) -> GenerationParams:
    """k None: num_draft_tokens absent, the draft length chosen per round."""
    return GenerationParams(max_tokens=max_tokens, temperature=0.0, num_draft_tokens=k)


def failures(server) -> dict[str, float]:
    return {r: server.metric("specdec_draft_failures_total", reason=r)
            for r in ("error", "timeout", "unavailable")}


def assert_released(server) -> None:
    assert wait_for(lambda: server.metric("specdec_active_sequences") == 0)
    for model in (names.DRAFT_MODEL, names.TARGET_MODEL):
        assert wait_for(lambda: server.metric("specdec_kv_slots_used", model=model) == 0)


def test_draft_faults_never_fail_a_request(fault_server):
    """Errors, a timeout and UNAVAILABLE from the draft: every answer is the target's own greedy
    text; the failures are counted by reason; the draft is tried again and comes back."""
    s = fault_server
    reference = [generate(s.http, p, greedy(0)).text for p in PROMPTS]   # K=0: no draft call
    assert failures(s) == {"error": 0, "timeout": 0, "unavailable": 0}
    # After each failure the draft is off for a backoff (0.5 s doubling to 10 s) before one
    # sequence probes it: requests go on until the faults are used up and the draft drafts
    # again, under a deadline no busy machine reaches.
    deadline = time.monotonic() + DRAFT_BACK_WITHIN_S
    i = 0
    while True:
        j = i % len(PROMPTS)
        r = generate(s.http, PROMPTS[j], greedy(4 if i % 2 else None))
        assert r.text == reference[j], f"request {i} (K={4 if i % 2 else 'auto'})"
        i += 1
        f = failures(s)
        if f["unavailable"] >= 2 and r.total_accepted_draft_tokens > 0:
            break
        assert time.monotonic() < deadline, \
            f"the draft never came back after its faults: {f} after {i} requests"
        time.sleep(0.3)
    assert f["error"] == 2 and f["unavailable"] == 2, f
    assert f["timeout"] >= 1, f          # the delayed call (and any call queued behind it)
    assert_released(s)


def test_overload_is_retryable_and_distinct_from_bad_input(fault_server):
    """Three times max_sequences streams at once, over HTTP SSE and gRPC: each completes, or is
    refused after queue_timeout_s with UNAVAILABLE; a bad request meanwhile is INVALID_ARGUMENT;
    nothing hangs; the gauges come back to 0 and the server still serves."""
    s = fault_server
    params = greedy(4, max_tokens=400)
    reference = generate(s.http, PROMPTS[0], greedy(0, max_tokens=400)).text

    def one(i):
        try:
            return "ok", (generate_stream if i % 2 else grpc_stream)(
                s.http if i % 2 else s.grpc, PROMPTS[0], params, timeout=60).wait().text
        except ServerError as e:
            return "refused", e

    with ThreadPoolExecutor(3 * SLOTS + 1) as pool:
        futures = [pool.submit(one, i) for i in range(3 * SLOTS)]
        bad = pool.submit(lambda: grpc_stream(s.grpc, PROMPTS[0], GenerationParams(
            max_tokens=100000)).wait())
        outcomes = [f.result(timeout=120) for f in futures]
        with pytest.raises(ServerError) as bad_error:
            bad.result(timeout=120)
    done = [text for kind, text in outcomes if kind == "ok"]
    refused = [e for kind, e in outcomes if kind == "refused"]
    assert done and refused, outcomes
    assert all(text == reference for text in done)
    # gRPC carries status codes only where the client may ask for them (Triton 2.68 and later);
    # on older servers the message's UNAVAILABLE: marker alone tells a retryable error.
    codes = s.grpc_status_codes
    for e in refused:
        assert e.retryable and names.UNAVAILABLE in e.message, e
        assert e.status in (400, "StatusCode.UNAVAILABLE" if codes else None), e   # HTTP: 400
    assert bad_error.value.status == ("StatusCode.INVALID_ARGUMENT" if codes else None)
    assert not bad_error.value.retryable and "max_tokens" in bad_error.value.message
    assert s.metric("specdec_requests_total", finish_reason="unavailable") >= len(refused)
    assert_released(s)
    assert generate(s.http, PROMPTS[0], greedy(4, max_tokens=400)).text == reference


def supervisor_state(server) -> dict:
    status, reply = post(server, f"/v2/models/{names.SUPERVISOR}/infer", {"inputs": []})
    assert status == 200, reply
    return json.loads(reply["outputs"][0]["data"][0])


def streams(server, n: int, params: GenerationParams):
    """n streams started, each past its first piece."""
    out = []
    for i in range(n):
        s = (grpc_stream(server.grpc, PROMPTS[i], params, timeout=60) if i % 2 else
             generate_stream(server.http, PROMPTS[i], params, timeout=60))
        first = next(s)
        out.append((s, first))
    return out


def finish(stream, first: str) -> str:
    return first + "".join(stream)


# kill -9 of a busy backend process can abort tritonserver itself: the process died holding a
# shared-memory mutex, and the server's next lock throws (docs/reliability.md, "Upstream hazard").
# The launcher then brings the server back (killing it first if it hangs in its exit). A kill
# scenario that met that abort runs again on the restarted server: it tests what we do when the
# server survives the kill; the abort's own recovery is the launcher's (test_keeper.py, the
# storm). Any other failure fails the test at once.
UPSTREAM_ABORT = "boost::interprocess::lock_exception"
ATTEMPTS = 4


def serving(server) -> bool:
    try:
        return all(p is None for p in probe(f"http://{server.http}", True, 5).values())
    except OSError:
        return False


def past_upstream_aborts(server, scenario) -> None:
    for attempt in range(1, ATTEMPTS + 1):
        assert wait_for(lambda: serving(server), 300), "the server is not serving"
        aborts = server.log.read_text(errors="replace").count(UPSTREAM_ABORT)
        try:
            return scenario(server)
        except Exception:
            if attempt == ATTEMPTS or \
                    server.log.read_text(errors="replace").count(UPSTREAM_ABORT) == aborts:
                raise
        print(f"\n{scenario.__name__}: tritonserver aborted ({UPSTREAM_ABORT}, upstream); "
              f"attempt {attempt + 1} on the server the launcher restarts")


def test_kill_the_draft_process_while_streams_run(fault_server):
    """kill -9 of draft_model's process: the streams in flight and the requests after finish
    with the target's greedy text, target-only while the draft is down; the supervisor restarts
    it and the draft drafts again (the new process knows no sequence: the loop re-prefills)."""
    past_upstream_aborts(fault_server, kill_the_draft)


def kill_the_draft(s) -> None:
    params = greedy(None, max_tokens=120)
    reference = [generate(s.http, p, greedy(0, max_tokens=120)).text for p in PROMPTS[:SLOTS]]
    restarts = s.metric("specdec_model_restarts_total", model=names.DRAFT_MODEL)
    old = s.backend_pid(names.DRAFT_MODEL)
    running = streams(s, SLOTS, params)
    killed_at = time.monotonic()
    os.kill(old, signal.SIGKILL)
    # Liveness (--all) sees the dead draft; readiness does not care: requests still succeed.
    assert probe(f"http://{s.http}", True, 5)[names.DRAFT_MODEL] is not None
    with ThreadPoolExecutor(SLOTS) as pool:
        texts = list(pool.map(lambda sf: finish(*sf), running, timeout=120))
    assert texts == reference
    assert generate(s.http, PROMPTS[0], params).text == reference[0]

    def drafting_again():   # fixed K: the policy's own choice of k does not blur the moment
        return generate(s.http, PROMPTS[0], greedy(4, 40)).total_accepted_draft_tokens > 0
    assert wait_for(drafting_again, 120), "the draft never came back"
    recovered_s = time.monotonic() - killed_at
    assert s.metric("specdec_model_restarts_total", model=names.DRAFT_MODEL) == restarts + 1
    restart_s = supervisor_state(s)[names.DRAFT_MODEL]["last_restart_s"]
    assert s.backend_pid(names.DRAFT_MODEL) != old
    assert all(p is None for p in probe(f"http://{s.http}", True, 5).values())
    print(f"\ndraft_model: killed; restarted in {restart_s:.1f} s; drafting again "
          f"{recovered_s:.1f} s after the kill")
    assert_released(s)


def test_kill_the_target_process_while_streams_run(fault_server):
    """kill -9 of target_model's process: the streams in flight end with an error naming it
    within a bounded time, none hangs, the slots and gauges return to 0, the probe fails while
    the target is down; the supervisor restarts it and the server serves exact output again."""
    past_upstream_aborts(fault_server, kill_the_target)


def kill_the_target(s) -> None:
    params = greedy(4, max_tokens=900)
    reference = generate(s.http, PROMPTS[0], greedy(0, max_tokens=60)).text
    restarts = s.metric("specdec_model_restarts_total", model=names.TARGET_MODEL)
    running = streams(s, SLOTS, params)
    killed_at = time.monotonic()
    os.kill(s.backend_pid(names.TARGET_MODEL), signal.SIGKILL)
    assert probe(f"http://{s.http}", False, 5)[names.TARGET_MODEL] is not None

    def outcome(sf):
        try:
            return finish(*sf)
        except ServerError as e:
            return e
    with ThreadPoolExecutor(SLOTS) as pool:
        outcomes = list(pool.map(outcome, running, timeout=60))
    ended_s = time.monotonic() - killed_at
    errors = [o for o in outcomes if isinstance(o, ServerError)]
    assert errors, "no stream noticed the dead target"
    for e in errors:   # retryable: the same request succeeds once the target is back
        assert names.TARGET_MODEL in e.message and e.retryable, e
    assert ended_s < 30, f"the streams took {ended_s:.1f} s to end"
    assert_released(s)
    assert wait_for(lambda: all(p is None for p in probe(f"http://{s.http}", False, 5).values()),
                    120), "the target never came back"
    recovered_s = time.monotonic() - killed_at
    assert generate(s.http, PROMPTS[0], greedy(4, max_tokens=60)).text == reference
    assert s.metric("specdec_model_restarts_total", model=names.TARGET_MODEL) == restarts + 1
    restart_s = supervisor_state(s)[names.TARGET_MODEL]["last_restart_s"]
    print(f"\ntarget_model: killed; streams ended with an error after {ended_s:.1f} s; "
          f"restarted in {restart_s:.1f} s; serving again {recovered_s:.1f} s after the kill")


def test_a_dead_orchestrator_fails_requests_at_once_and_the_probes(fault_server):
    """kill -9 of the decoupled speculative_decoding's process: requests fail within seconds
    (never hang) and both probes fail. Nothing restarts it in place (the supervisor restarts
    only draft and target): liveness replaces the container. Last: the server stays broken."""
    past_upstream_aborts(fault_server, kill_the_orchestrator)


def kill_the_orchestrator(s) -> None:
    os.kill(s.backend_pid(names.ORCHESTRATOR), signal.SIGKILL)
    t0 = time.monotonic()
    with pytest.raises(ServerError) as err:
        generate(s.http, PROMPTS[0], greedy(4), timeout=60)
    assert time.monotonic() - t0 < 15 and "is not healthy" in err.value.message
    for everything in (False, True):
        assert probe(f"http://{s.http}", everything, 5)[names.ORCHESTRATOR] is not None
