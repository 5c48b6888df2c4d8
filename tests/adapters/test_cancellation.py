"""How a generation ends when its client leaves: its own request cancelled (asked at most every
CANCEL_CHECK_S), or, inside the ensemble, postprocessing's `cancel_generation` control request
(bls.CancelForwarder, asked at most every 0.1 s a generation)."""
import asyncio
import time

import numpy as np
import pytest

from specdec import names
from specdec.serving import courier
from tests.adapters import fake_pb
from tests.adapters.conftest import orchestrator_request, run_all
from tests.adapters.responses import (FINAL, PROMPTS, assert_all_released, assert_one_final,
                                      finish_reason, out, output_ids)


@pytest.mark.parametrize("stream", [True, False])
def test_cancelled_midway(serving, stream):
    orch = serving.orchestrator()
    target_calls = serving.target_bls.batches
    # Cancelled once the first response went out (streaming), or after three target rounds.
    if stream:
        cancelled = lambda sender: len(sender.sent) >= 1   # noqa: E731
    else:
        cancelled = lambda sender: len(target_calls) >= 3  # noqa: E731
    r = orchestrator_request(PROMPTS[2], max_tokens=40, stream=stream, num_draft_tokens=2,
                             temperature=0.8, seed=5, cancelled=cancelled)
    other = orchestrator_request(PROMPTS[0], max_tokens=40, stream=stream)
    run_all(orch, [r, other])
    assert_one_final(r)
    last = r.sender.responses()[-1]
    assert not last.has_error() and finish_reason(last) == "cancelled"
    assert 0 < len(output_ids(r)) < 40
    assert int(out(last, names.NUM_OUTPUT_TOKENS)[0]) == len(output_ids(r))
    assert len(output_ids(other)) == 40
    assert_all_released(serving)


@pytest.mark.parametrize("threaded", [False, True])
def test_the_client_is_asked_about_cancellation_at_most_every_check_interval(serving,
                                                                           monkeypatch,
                                                                           threaded):
    """is_cancelled() is a round trip to the server process (orchestrator.CANCEL_CHECK_S): a
    generation asks it on its first round and then at most once an interval, however many
    rounds it runs; a request cancelled meanwhile still ends. In the server (threaded) the
    courier's thread asks it, never the event loop, and a later round sees the answer."""
    import threading

    from specdec.serving import orchestrator
    asked = []   # (when, on which thread)

    def cancelled(sender):
        asked.append((time.monotonic(), threading.current_thread().name))
        return len(asked) == 3   # the third time asked, the client has gone

    monkeypatch.setattr(courier, "THREADED", threaded)
    monkeypatch.setattr(orchestrator, "CANCEL_CHECK_S", 0.01)
    orch = serving.orchestrator()
    # When the loop posts each ask: the courier runs it after what was posted before it (a
    # response it builds and sends), so the asks themselves may run closer together.
    posted, post = [], orch.courier.post

    def recording(fn, *args, **kwargs):
        if fn == orch._ask:
            posted.append(time.monotonic())
        post(fn, *args, **kwargs)
    orch.courier.post = recording
    r = orchestrator_request(PROMPTS[2], max_tokens=200, stream=True, num_draft_tokens=0,
                             cancelled=cancelled)
    run_all(orch, [r])
    assert_one_final(r)
    assert finish_reason(r.sender.responses()[-1]) == "cancelled"
    rounds = len(output_ids(r))   # target-only: a token a round
    assert len(asked) == 3 and len(asked) <= rounds < 200   # once a round at most, and the rest
    assert len(posted) >= len(asked)   # one posted after the answer finds it cancelled
    # 0.009: the loop's clock was read just before the post this one reads just after
    assert all(b - a >= 0.009 for a, b in zip(posted, posted[1:])), posted
    assert all((name == courier.THREAD_NAME) == threaded for _, name in asked), asked
    assert_all_released(serving)


def test_cancelled_before_start(serving):
    orch = serving.orchestrator()
    r = orchestrator_request(PROMPTS[0], cancelled=lambda sender: True)
    run_all(orch, [r])
    assert_one_final(r)
    (resp,) = r.sender.responses()
    assert finish_reason(resp) == "cancelled" and output_ids(r) == []
    assert_all_released(serving)


def test_a_control_request_cancels_a_generation_by_the_id_its_responses_carry(serving):
    """Inside the ensemble the orchestrator's own request is never the cancelled one:
    postprocessing sends `cancel_generation` with the id every response carries, and the
    generation ends at its next round, as when its own request is cancelled. An id that is not
    running changes nothing; a control request is answered at once with FINAL alone."""
    orch = serving.orchestrator()
    controls = []

    def on_first(response, flags):
        if controls or response is None:
            return
        gid = int(out(response, names.GENERATION_ID)[0])
        controls.append(orchestrator_request([], cancel_generation=gid))
        asyncio.get_running_loop().create_task(orch.handle(controls[0]))

    r = orchestrator_request(PROMPTS[2], max_tokens=40, stream=True, num_draft_tokens=2,
                             on_send=on_first)
    other = orchestrator_request(PROMPTS[0], max_tokens=40, stream=True)
    stray = orchestrator_request([], cancel_generation=12345)
    run_all(orch, [r, other, stray])
    last = r.sender.responses()[-1]
    assert finish_reason(last) == "cancelled" and 0 < len(output_ids(r)) < 40
    ids = {int(out(x, names.GENERATION_ID)[0]) for x in r.sender.responses()}
    assert len(ids) == 1
    others = {int(out(x, names.GENERATION_ID)[0]) for x in other.sender.responses()}
    assert len(others) == 1 and others != ids
    # Random, not counted: a client that knows its own id cannot name its neighbour's.
    assert abs(ids.pop() - others.pop()) > 1
    assert len(output_ids(other)) == 40
    for control in controls + [stray]:
        assert control.sender.sent == [(None, FINAL)]
    assert not orch.running and not orch.cancelled
    assert_all_released(serving)


class _StubPb:
    """The Python backend's blocking BLS, recorded (CancelForwarder's only use of it)."""
    Tensor = fake_pb.Tensor

    def __init__(self, fail: bool = False):
        self.sent, self.fail = [], fail

    def InferenceRequest(self, model_name, inputs, requested_output_names):  # noqa: N802
        stub = self

        class _Call:
            def exec(self, decoupled=False):
                assert decoupled      # the orchestrator is decoupled
                if stub.fail:
                    raise RuntimeError("speculative_decoding is restarting")
                fake_pb.ModelConfig(model_name).check_inputs(inputs)
                stub.sent.append({t.name(): t.as_numpy().tolist() for t in inputs})
                return iter([fake_pb.InferenceResponse([])])
        return _Call()


def test_postprocessing_forwards_a_cancellation_once_per_generation():
    from specdec.serving.bls import CancelForwarder

    pb = _StubPb()
    forward = CancelForwarder(pb, remember=2, every_s=0.0)
    live = fake_pb.Request({names.OUTPUT_IDS: np.array([1], np.int32)})
    gone = fake_pb.Request({names.OUTPUT_IDS: np.array([1], np.int32)},
                           cancelled=lambda sender: True)
    assert not forward.check(live, 7) and not forward.check(gone, None)
    assert forward.check(gone, 7) and not forward.check(gone, 7)   # later steps: already sent
    assert pb.sent == [{names.INPUT_IDS: [], names.CANCEL_GENERATION: [7]}]
    assert forward.check(gone, 8) and forward.check(gone, 9) and forward.check(gone, 7)
    assert len(forward.sent) == 2                                  # it forgets the oldest
    failing = CancelForwarder(_StubPb(fail=True))
    assert not failing.check(gone, 7)                              # never the step's error


def test_postprocessing_asks_each_generation_at_most_every_interval():
    """is_cancelled() is a round trip to the server on postprocessing's one instance: asked of a
    generation's first response, then once an interval has passed; never of a final response,
    which forgets the generation."""
    from specdec.serving.bls import CancelForwarder

    now, asked, gone = [0.0], [], set()
    pb = _StubPb()
    forward = CancelForwarder(pb, remember=3, every_s=0.1, clock=lambda: now[0])

    def request(gid):
        def cancelled(sender):
            asked.append(gid)
            return gid in gone
        return fake_pb.Request({names.OUTPUT_IDS: np.array([1], np.int32)}, cancelled=cancelled)

    assert not forward.check(request(1), 1) and not forward.check(request(2), 2)
    now[0] = 0.05
    gone.add(1)   # the client leaves: seen once the interval has passed, not before
    assert not forward.check(request(1), 1) and not forward.check(request(2), 2)
    assert asked == [1, 2]
    now[0] = 0.11
    assert forward.check(request(1), 1) and not forward.check(request(2), 2)
    assert asked == [1, 2, 1, 2]
    assert pb.sent == [{names.INPUT_IDS: [], names.CANCEL_GENERATION: [1]}]
    assert not forward.check(request(1), 1)   # sent: never asked again
    assert not forward.check(request(2), 2, final=True) and 2 not in forward.asked
    now[0] = 0.12
    assert not forward.check(request(2), 2)  # a new id's first response (or one forgotten) asks
    for gid in (3, 4, 5):
        forward.check(request(gid), gid)
    assert list(forward.asked) == [3, 4, 5] and asked == [1, 2, 1, 2, 2, 3, 4, 5]
