"""specdec.serving.adapter and calls: error codes, tensor I/O, the BLS wire format; and that
fake_pb is as strict as the parts of Triton these tests rely on."""
import numpy as np
import pytest
import torch

from specdec import names
from specdec.runtime.config import CheckpointError
from specdec.records import (Failure, Proposer, ProposeCall, SlotError, TokenLogprob, Verdict,
                             VerifyCall)
from specdec.runtime.sampling import SamplingParams
from specdec.serving import calls
from specdec.serving.adapter import (ModelCallError, error_response, parameters, read_inputs,
                                     triton_error)
from specdec.serving.dlpack import read_torch, torch_output
from specdec.serving.orchestrator import Unavailable
from specdec.serving.requests import InvalidInput
from tests.adapters import fake_pb

E = fake_pb.TritonError


@pytest.mark.parametrize("exc,code", [
    (InvalidInput("top_p: bad"), E.INVALID_ARG),
    (SlotError("all 4 sequence slots are in use", unavailable=True), E.UNAVAILABLE),
    (ModelCallError("draft_model: full", unavailable=True), E.UNAVAILABLE),
    (Unavailable("busy"), E.UNAVAILABLE),
    (SlotError("sequence 3 is not open"), E.INTERNAL),
    (ModelCallError("target_model: boom"), E.INTERNAL),
    (CheckpointError("bad checkpoint"), E.INTERNAL),
    (KeyError("tokens"), E.INTERNAL),
])
def test_error_codes(exc, code):
    err = triton_error(fake_pb, exc)
    retryable = code == E.UNAVAILABLE
    # A client matches the marker where the status is lost (HTTP generate answers 400).
    assert err.code() == code
    assert err.message() == (f"{names.UNAVAILABLE} {exc}" if retryable else str(exc))
    response = error_response(fake_pb, exc)
    assert response.has_error() and response.output_tensors() == []


def test_the_marker_is_not_repeated():
    inner = triton_error(fake_pb, SlotError("all 4 sequence slots are in use", unavailable=True))
    outer = triton_error(fake_pb, ModelCallError(f"target_model: {inner.message()}",
                                                 unavailable=True))
    assert outer.message() == f"target_model: {names.UNAVAILABLE} all 4 sequence slots are in use"


def test_read_inputs_leaves_absent_ones_out():
    request = fake_pb.Request({"a": np.array([1], np.int32), "b": np.array([2.0], np.float32)})
    got = read_inputs(fake_pb, request, ("a", "c"))
    assert list(got) == ["a"] and got["a"].tolist() == [1]
    assert read_torch(fake_pb, request, "c") is None


def test_torch_tensors_travel_by_dlpack():
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4)[:, 1:]     # not contiguous
    out = torch_output(fake_pb, names.DRAFT_PROBS, t)
    assert out.name() == names.DRAFT_PROBS and out.shape() == [3, 3]
    request = fake_pb.Request({})
    request._inputs.append(out)
    back = read_torch(fake_pb, request, names.DRAFT_PROBS)
    assert torch.equal(back, t)


def test_parameters():
    assert parameters({}) == {} and parameters({"parameters": None}) == {}
    assert parameters({"parameters": {"x": {"string_value": "1"}}}) == {"x": {"string_value": "1"}}


def test_wire_format_round_trip_and_config_types():
    s = SamplingParams(0.5, 7, 0.9, 2**64 - 5)
    propose = ProposeCall(2**63 + 11, 5, [3, 4], 3, s)
    verify = VerifyCall(2**63 + 11, 5, [3, 4], [8, 9], None, s)
    p_in, v_in = calls.propose_inputs(propose), calls.verify_inputs([verify])
    fake_pb.ModelConfig("draft_model").check_inputs([fake_pb.Tensor(n, v) for n, v in p_in.items()])
    fake_pb.ModelConfig("target_model").check_inputs([fake_pb.Tensor(n, v) for n, v in v_in.items()])
    fake_pb.ModelConfig("target_model").check_inputs(
        [fake_pb.Tensor(n, v) for n, v in calls.release_inputs(9).items()])
    back = calls.propose_call(p_in)
    assert (back.seq_id, back.start, back.tokens, back.k) == (2**63 + 11, 5, [3, 4], 3)
    assert back.sampling.seed == 2**64 - 5 and back.sampling.top_k == 7
    assert back.sampling.temperature == pytest.approx(0.5) and back.sampling.top_p == pytest.approx(0.9)
    [v] = calls.verify_calls(v_in, None)
    assert (v.seq_id, v.start, v.tokens, v.drafts, v.draft_probs) == (2**63 + 11, 5, [3, 4], [8, 9], None)
    assert one(calls.verify_inputs([VerifyCall(1, 0, [3], [], None, s)])).drafts == []
    assert calls.is_release(calls.release_inputs(9)) and not calls.is_release(p_in)
    assert set(p_in) == {names.CALL, names.SAMPLING, names.TOKENS}  # every tensor costs a call
    # Triton batches only requests with the same inputs: drafted or not, a verification has
    # the release's (draft_probs, a sampled draft's from draft_model, is the one extra).
    assert set(v_in) == set(calls.verify_inputs([VerifyCall(1, 0, [3], [], None, s)])) == \
        set(calls.release_inputs(9)) == set(p_in)
    bad = calls.verify_inputs([VerifyCall(1, 0, [3], [4], None, s)])
    bad[names.CALL][0, 2] = 2   # two drafts claimed in two tokens: no committed token left
    [error] = calls.verify_calls(bad, None)
    assert isinstance(error, ValueError) and "2 drafts in 2 tokens" in str(error)
    assert calls.sequence_id(calls.release_inputs(2**64 - 1)) == 2**64 - 1
    for by in (Proposer.EAGLE, Proposer.DRAFT, Proposer.SELF, Proposer.MEDUSA):
        call = VerifyCall(5, 7, [3], [1, 2], None, s, next_k=4, drafts_in_target=True,
                          next_by=by)
        back = one(calls.verify_inputs([call]))
        assert (back.next_k, back.drafts_in_target, back.drafts, back.next_by) == \
            (4, True, [1, 2], by)
    assert one(calls.verify_inputs([VerifyCall(5, 0, [3], [], None, s)])).next_k is None
    asked = VerifyCall(5, 0, [3, 4], [1], None, SamplingParams(0.75, 5, 0.5, 3), logprobs=3,
                       prompt_logprobs=0)
    assert one(calls.verify_inputs([asked])) == asked
    back = one(calls.verify_inputs([VerifyCall(5, 0, [3], [], None, s)]))
    assert (back.logprobs, back.prompt_logprobs) == (None, None)
    p_in[names.CALL] = p_in[names.CALL][:, :4]
    with pytest.raises(ValueError, match=r"call has shape \[1, 4\], expected \[rows, 12\]"):
        calls.propose_call(p_in)


def one(inputs):
    [call] = calls.verify_calls(inputs, None)
    return call


def test_a_round_travels_as_one_request_of_rows():
    """Rows of different lengths, samplings and proposers pad to one request and come back
    apart; a row that makes no sense fails alone; verdicts and failures return by row."""
    greedy, sampled = SamplingParams(), SamplingParams(0.75, 5, 0.5, 2**64 - 1)   # FP32-exact
    round_ = [VerifyCall(1, 0, [5, 6, 7, 8, 9], [], None, greedy),        # a prefill
              VerifyCall(2**63, 12, [4], [1, 2, 3], None, sampled, next_k=2,
                         drafts_in_target=True, next_by=Proposer.DRAFT),
              VerifyCall(3, 7, [0], [0], None, greedy)]                    # token id 0 is real
    inputs = calls.verify_inputs(round_)
    assert inputs[names.TOKENS].shape == (3, 5)
    fake_pb.ModelConfig("target_model").check_inputs(
        [fake_pb.Tensor(n, v) for n, v in inputs.items()])
    assert calls.verify_calls(inputs, None) == round_
    inputs[names.CALL][1, 9] = 6   # row 1 claims more tokens than the request's width
    back = calls.verify_calls(inputs, None)
    assert back[0] == round_[0] and back[2] == round_[2]
    assert isinstance(back[1], ValueError) and "6 tokens in a row of 5" in str(back[1])
    with pytest.raises(ValueError, match="one row"):
        calls.verify_calls(calls.verify_inputs(round_), torch.zeros(1, 1, 4))

    out = [Verdict([7, 8, 9], 2),
           Verdict([7, 8], 1, [4, 5, 6], 0.001234, None),      # a head's next proposal
           ("target_model: sequence 3 is not open ✗", False),
           Verdict([3], 0, None, 0.5, Failure.ERROR),            # the drafter failed
           ("no free KV slot", True),
           Verdict([3, 4], 1, [9], 0.002, None, batch_k=6, steps=5, fed=40),   # a catch-up
           # scored: float32-exact values, -inf (top-k's filtered) and none asked for the prompt
           Verdict([3, 4], 1, [9], logprobs=[TokenLogprob(-0.25, ((3, -0.25), (7, -1.5))),
                                             TokenLogprob(-2.0, ((1, -0.5), (4, -2.0)))]),
           Verdict([5], 0, prompt_logprobs=[TokenLogprob(-3.5), TokenLogprob(float("-inf"))]),
           Verdict([5], 0, logprobs=[TokenLogprob(-1.0)], prompt_logprobs=[])]
    output = calls.verdict_output(out)
    fake_pb.ModelConfig("target_model").check_outputs([fake_pb.Tensor(names.VERDICT, output)])
    back = calls.verdicts(output)
    assert [back[i] for i in (0, 1, 3, 5, 6, 7, 8)] == [out[i] for i in (0, 1, 3, 5, 6, 7, 8)]
    for i in (2, 4):
        assert isinstance(back[i], SlotError)
        assert (str(back[i]), back[i].unavailable) == out[i]


# --- the fake's own strictness

def test_fake_sender_refuses_sends_after_final():
    sender = fake_pb.Request({}).get_response_sender()
    sender.send(fake_pb.InferenceResponse([]), flags=0)
    sender.send(flags=fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
    with pytest.raises(RuntimeError, match="closed"):
        sender.send(flags=fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)


def test_fake_checks_config_types():
    config = fake_pb.ModelConfig("speculative_decoding")
    with pytest.raises(ValueError, match="TYPE_INT64"):
        config.check_inputs([fake_pb.Tensor(names.INPUT_IDS, np.array([1], np.int64))])
    with pytest.raises(ValueError, match="missing required"):
        config.check_inputs([fake_pb.Tensor(names.MAX_TOKENS, np.array([1], np.int32))])
    with pytest.raises(ValueError, match="shape"):
        config.check_inputs([fake_pb.Tensor(names.INPUT_IDS, np.array([[1]], np.int32))])
    with pytest.raises(TypeError):
        fake_pb.Tensor("x", [1, 2])


def test_the_probe_releases_as_calls_packs_it():
    """specdec probe stays free of torch: it spells the release call out; it must be this one."""
    from specdec.serving import probe
    spelled = {t["name"]: t["data"] for t in probe.INFER[names.TARGET_MODEL]}
    packed = {n: v.reshape(-1).tolist() for n, v in calls.release_inputs(0).items()}
    assert spelled == packed
    assert calls.is_release(calls.release_inputs(0)) and calls.sequence_id(calls.release_inputs(0)) == 0
