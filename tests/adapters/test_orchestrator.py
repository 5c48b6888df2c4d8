"""Orchestrator + BlsDrafter/BlsVerifier + DraftModel/TargetModel over tiny real checkpoints,
wired through fake_pb: BLS requests reach the real engine models, batched per event-loop turn."""
import asyncio

import numpy as np
import pytest
import torch

from specdec import names
from specdec.runtime.engine import Engine
from specdec.decoding.local import LocalDrafter, LocalVerifier
from specdec.decoding.loop import speculate
from specdec.proposers.ngram import NgramProposer
from specdec.records import ProposeCall, Request, SlotError, VerifyCall
from specdec.runtime.sampling import SamplingParams
from specdec.serving import calls, courier
from specdec.runtime.weights import load_model
from tests.adapters import fake_pb
from tests.adapters.conftest import MAX_SEQ_LEN, orchestrator_request, run_all
from tests.adapters.responses import (FINAL, PROMPTS, assert_all_released, assert_one_final,
                                      finish_reason, out, output_ids)


def local_chunks(checkpoints, req: Request) -> list:
    """A request through the in-process loop (no Triton, no wire format): its chunks."""
    target, draft = checkpoints
    cpu = torch.device("cpu")
    t = Engine(load_model(target, torch.float32, cpu), 2, MAX_SEQ_LEN, cpu)
    d = Engine(load_model(draft, torch.float32, cpu), 2, MAX_SEQ_LEN, cpu,
               vocab_size=t.model.args.vocab_size)
    chunks = []
    asyncio.run(speculate(1, req, LocalDrafter(d), LocalVerifier(t), MAX_SEQ_LEN, chunks.append,
                          ngram=NgramProposer()))
    return chunks


def local_reference(checkpoints, prompt, max_tokens, k, sampling):
    """The same request in process, with the server's default proposer beside a draft model:
    hybrid. (Sampled tokens depend on what was proposed, not only on the seed: the reference
    must propose as the server does.)"""
    chunks = local_chunks(checkpoints, Request(prompt, max_tokens, k, sampling,
                                               proposer="hybrid"))
    return [tok for c in chunks for tok in c.tokens]


@pytest.mark.parametrize("temperature,threaded", [(0.0, False), (0.75, False), (0.0, True)])
def test_streamed_equals_non_streamed_equals_in_process(serving, checkpoints, temperature,
                                                        threaded, monkeypatch):
    """Exact in float32, as on the wire; threaded: responses and metric updates leave from the
    courier's thread, as in the server."""
    monkeypatch.setattr(courier, "THREADED", threaded)
    orch = serving.orchestrator()
    fields = dict(max_tokens=24, temperature=temperature, seed=1234, num_draft_tokens=3)
    requests = [orchestrator_request(p, stream=s, **fields) for p in PROMPTS for s in (False, True)]
    run_all(orch, requests)   # all eight concurrently: BLS calls of different sequences batch

    for i, p in enumerate(PROMPTS):
        plain, streamed = requests[2 * i], requests[2 * i + 1]
        for r in (plain, streamed):
            assert_one_final(r)
        assert len(plain.sender.responses()) == 1
        assert len(streamed.sender.responses()) > 2
        ids = output_ids(plain)
        assert len(ids) == 24
        assert output_ids(streamed) == ids
        assert ids == local_reference(checkpoints, p, 24, 3,
                                      SamplingParams(temperature, 0, 1.0, 1234))
        last = streamed.sender.responses()[-1]
        assert finish_reason(last) == "length" and bool(out(last, names.IS_FINAL)[0])
        assert int(out(last, names.NUM_OUTPUT_TOKENS)[0]) == 24
        # num_output_tokens so far on every response, the other statistics on the last
        # alone: Triton's OpenAI frontend sums the responses that carry both token counts
        so_far = []
        for r in streamed.sender.responses()[:-1]:
            assert not out(r, names.IS_FINAL)[0]
            so_far.append(int(out(r, names.NUM_OUTPUT_TOKENS)[0]))
            assert all(fake_pb.get_output_tensor_by_name(r, n) is None
                       for n in names.STATS_OUTPUTS if n != names.NUM_OUTPUT_TOKENS)
        assert so_far == sorted(set(so_far)) and 0 < so_far[0] and so_far[-1] <= 24
        assert all(fake_pb.get_output_tensor_by_name(last, n) is not None
                   for n in names.STATS_OUTPUTS)
    # Draft and target saw batches of several sequences, not one call per request; the
    # target's, a round of all four sequences under way (batching.py).
    assert max(serving.draft_bls.batches) > 1 and max(serving.target_bls.rows) == 4
    if not temperature:   # greedy drafts carry no q: the four rows travel as one request
        assert (1, 4) in zip(serving.target_bls.batches, serving.target_bls.rows)
    assert_all_released(serving)
    assert max(serving.gauge.history) == 4          # orchestrator max_sequences: 4 at a time


def _scored(request, values, ids=None, top=None):
    """A logprob output over a request's responses: values [n] and, named, ids [n, top]."""
    rs = [r for r in request.sender.responses()
          if fake_pb.get_output_tensor_by_name(r, values) is not None]
    got = [(v, list(zip(i, t))) if ids else (v, [])
           for r in rs for v, i, t in zip(out(r, values).tolist(),
                                          *((out(r, ids).tolist(), out(r, top).tolist()) if ids
                                            else ([[]] * len(out(r, values)),) * 2))]
    return rs, got


def test_logprobs_travel_with_their_tokens_over_the_wire(serving, checkpoints):
    """The target's logprobs cross target_model's wire and leave in the responses that carry
    their tokens, the prompt's in the first: as the in-process loop scores them."""
    from tests.core.test_logprobs import TOL
    orch = serving.orchestrator()
    fields = dict(max_tokens=12, num_draft_tokens=3, top_logprobs=2, prompt_logprobs=1)
    requests = [orchestrator_request(PROMPTS[0], stream=s, **fields) for s in (False, True)]
    run_all(orch, requests)
    chunks = local_chunks(checkpoints, Request(PROMPTS[0], 12, 3, logprobs=2, prompt_logprobs=1,
                                               proposer="hybrid"))
    want = [(lp.logprob, list(lp.top)) for c in chunks for lp in c.logprobs]
    want_prompt = [(lp.logprob, list(lp.top)) for lp in chunks[0].prompt_logprobs]
    for r in requests:
        assert_one_final(r)
        assert output_ids(r) == [tok for c in chunks for tok in c.tokens]
        _, got = _scored(r, names.OUTPUT_LOG_PROBS, names.TOP_LOGPROB_IDS,
                         names.TOP_LOGPROB_VALUES)
        assert len(got) == len(want) == 12
        for (v, top), (w, wtop) in zip(got, want):
            assert v == pytest.approx(w, abs=TOL)
            assert [i for i, _ in top] == [i for i, _ in wtop]
        rs, got = _scored(r, names.PROMPT_LOG_PROBS, names.PROMPT_TOP_LOGPROB_IDS,
                          names.PROMPT_TOP_LOGPROB_VALUES)
        assert rs == r.sender.responses()[:1] and len(got) == len(PROMPTS[0]) - 1
        assert [v for v, _ in got] == pytest.approx([w for w, _ in want_prompt], abs=TOL)
    # Each streamed response carries its own new tokens' logprobs.
    for resp in requests[1].sender.responses():
        new = len(out(resp, names.OUTPUT_IDS)) - int(out(resp, names.PREFIX_LENGTH)[0])
        assert len(out(resp, names.OUTPUT_LOG_PROBS)) == new
    # The prompt scored alone (max_tokens 0); max_tokens 0 without it is refused above.
    alone = orchestrator_request(PROMPTS[1], max_tokens=0, prompt_logprobs=0)
    plain = orchestrator_request(PROMPTS[1], max_tokens=4)
    run_all(orch, [alone, plain])
    (resp,) = alone.sender.responses()
    assert output_ids(alone) == [] and finish_reason(resp) == "length"
    assert len(out(resp, names.PROMPT_LOG_PROBS)) == len(PROMPTS[1]) - 1
    assert fake_pb.get_output_tensor_by_name(resp, names.PROMPT_TOP_LOGPROB_IDS) is None
    assert all(fake_pb.get_output_tensor_by_name(r, n) is None
               for r in plain.sender.responses()
               for n in (names.OUTPUT_LOG_PROBS, names.PROMPT_LOG_PROBS))
    assert_all_released(serving)


def test_stream_windows_overlap_the_shown_ids(serving):
    orch = serving.orchestrator()
    r = orchestrator_request(PROMPTS[0], stream=True, max_tokens=30, num_draft_tokens=2)
    run_all(orch, [r])
    shown = []
    for resp in r.sender.responses():
        ids = out(resp, names.OUTPUT_IDS).tolist()
        prefix = int(out(resp, names.PREFIX_LENGTH)[0])
        assert prefix == min(len(shown), 8)
        assert ids[:prefix] == shown[len(shown) - prefix:]
        shown += ids[prefix:]
    assert len(shown) == 30
    stats = r.sender.responses()[-1]
    drafted = int(out(stats, names.TOTAL_DRAFT_TOKENS)[0])
    accepted = int(out(stats, names.TOTAL_ACCEPTED_DRAFT_TOKENS)[0])
    assert 0 < accepted < drafted   # the noisy draft is sometimes right, sometimes wrong
    assert float(out(stats, names.ACCEPTANCE_RATE)[0]) == pytest.approx(accepted / drafted)


def test_stop_and_eos(serving):
    orch = serving.orchestrator()
    probe = orchestrator_request(PROMPTS[1], max_tokens=12)
    run_all(orch, [probe])
    ids = output_ids(probe)
    # A stop sequence of the 4th and 5th generated tokens: generation ends before them.
    stop = orchestrator_request(PROMPTS[1], max_tokens=12, stop_ids=ids[3:5], stop_lengths=[2])
    eos_orch = serving.orchestrator(eos=[ids[2]])
    eos = orchestrator_request(PROMPTS[1], max_tokens=12, stream=True)
    run_all(orch, [stop])
    run_all(eos_orch, [eos])
    assert finish_reason(stop.sender.responses()[-1]) == "stop"
    first = next(j for j in range(len(ids)) if ids[j:j + 2] == ids[3:5])   # 3, or earlier
    assert output_ids(stop) == ids[:first]
    assert finish_reason(eos.sender.responses()[-1]) == "eos"
    assert output_ids(eos) == ids[:ids.index(ids[2])]
    for r in (stop, eos):
        assert_one_final(r)
    assert_all_released(serving)


@pytest.mark.parametrize("fields,field", [
    (dict(top_p=0.0), names.TOP_P),
    (dict(max_tokens=0), names.MAX_TOKENS),
    (dict(num_draft_tokens=99), names.NUM_DRAFT_TOKENS),
    (dict(temperature=float("nan")), names.TEMPERATURE),
    (dict(top_logprobs=21), names.TOP_LOGPROBS),
    (dict(prompt_logprobs=-2), names.PROMPT_LOGPROBS),
])
def test_invalid_input_is_one_final_invalid_arg(serving, fields, field):
    orch = serving.orchestrator()
    bad = orchestrator_request(PROMPTS[0], **fields)
    good = orchestrator_request(PROMPTS[0], max_tokens=5)
    run_all(orch, [bad, good])
    assert_one_final(bad)
    (resp,) = bad.sender.responses()
    assert resp.has_error() and resp.error().code() == fake_pb.TritonError.INVALID_ARG
    assert resp.error().message().startswith(field + ":")
    assert len(output_ids(good)) == 5                    # the other request was unaffected
    assert_all_released(serving)


def test_prompt_filling_the_context_window_is_invalid_arg(serving):
    orch = serving.orchestrator()
    r = orchestrator_request(list(range(MAX_SEQ_LEN)))
    run_all(orch, [r])
    assert_one_final(r)
    assert r.sender.responses()[0].error().code() == fake_pb.TritonError.INVALID_ARG
    assert r.sender.responses()[0].error().message().startswith("text_input:")


def test_output_stops_at_the_context_window(serving):
    orch = serving.orchestrator(max_tokens_limit=200)
    prompt = list(range(10, 10 + MAX_SEQ_LEN - 6))
    r = orchestrator_request(prompt, max_tokens=200, stream=True, num_draft_tokens=4)
    run_all(orch, [r])
    assert_one_final(r)
    ids = output_ids(r)
    assert finish_reason(r.sender.responses()[-1]) == "length"
    # The last token needs no cache slot: the window holds prompt + output - 1 tokens.
    assert len(prompt) + len(ids) == MAX_SEQ_LEN + 1
    assert_all_released(serving)


def test_admission_times_out_with_unavailable(serving):
    orch = serving.orchestrator(max_sequences=1, queue_timeout_s=0.05)
    second_done = None

    async def hold_models_until_the_second_is_answered(request):
        await second_done.wait()

    def on_second_send(response, flags):
        if flags & FINAL:
            second_done.set()

    first = orchestrator_request(PROMPTS[0], max_tokens=10, stream=True)
    second = orchestrator_request(PROMPTS[1], max_tokens=10, on_send=on_second_send)

    async def main():
        nonlocal second_done
        second_done = asyncio.Event()
        fake_pb.before_exec = hold_models_until_the_second_is_answered
        await asyncio.gather(orch.handle(first), orch.handle(second))

    asyncio.run(main())
    assert_one_final(second)
    (err,) = second.sender.responses()
    assert err.has_error() and err.error().code() == fake_pb.TritonError.UNAVAILABLE
    assert "retry" in err.error().message()
    assert_one_final(first)
    assert len(output_ids(first)) == 10
    assert serving.gauge.history == [1, 0]          # the second was never admitted
    # The slot is free again: the next request is served.
    fake_pb.before_exec = None
    third = orchestrator_request(PROMPTS[1], max_tokens=4)
    run_all(orch, [third])
    assert len(output_ids(third)) == 4
    assert_all_released(serving)


def test_models_out_of_slots_answer_unavailable(serving):
    """The orchestrator admits more sequences than the models hold: the extra one is refused by
    target_model (which opens first, in the prefill round), and that request alone fails with
    UNAVAILABLE."""
    serving.build(engine_sequences=1)
    orch = serving.orchestrator(max_sequences=2)
    a = orchestrator_request(PROMPTS[0], max_tokens=6)
    b = orchestrator_request(PROMPTS[1], max_tokens=6)
    run_all(orch, [a, b])
    for r in (a, b):
        assert_one_final(r)
    errors = [r.sender.responses()[0] for r in (a, b) if r.sender.responses()[0].has_error()]
    assert len(errors) == 1
    assert errors[0].error().code() == fake_pb.TritonError.UNAVAILABLE
    assert errors[0].error().message().startswith("target_model:")
    ok = a if errors[0] is b.sender.responses()[0] else b
    assert len(output_ids(ok)) == 6
    assert_all_released(serving)


def test_model_failure_is_internal_and_releases(serving):
    """A BLS call that fails (the target's execute raises) ends the request with INTERNAL; the
    draft's slot, already opened, is still released."""
    orch = serving.orchestrator()

    class Broken:
        def execute(self, requests):
            # Fails once drafts arrive: after the prefill round, with the draft's slot open.
            inputs = {n: fake_pb.get_input_tensor_by_name(requests[0], n).as_numpy()
                      for n in (names.CALL, names.SAMPLING, names.TOKENS)}
            if any(c.drafts for c in calls.verify_calls(inputs, None)):
                raise RuntimeError("target exploded")
            return serving.target.execute(requests)

    fake_pb.register("target_model", Broken(), fake_pb.ModelConfig("target_model"))
    r = orchestrator_request(PROMPTS[0], max_tokens=6, stream=True)
    run_all(orch, [r])
    assert_one_final(r)
    *streamed, resp = r.sender.responses()  # the prefill round's token, then the failure
    assert len(streamed) == 1 and resp.error().code() == fake_pb.TritonError.INTERNAL
    assert "target exploded" in resp.error().message()
    assert serving.draft_bls.batches            # the draft did open a slot ...
    assert_all_released(serving)               # ... and it was released


# --- draft_model / target_model execute() with several requests at once

def engine_request(model, inputs, requested):
    return fake_pb.InferenceRequest(model, [fake_pb.Tensor(n, v) for n, v in inputs.items()],
                                    requested)


def propose_request(seq_id, start, tokens, temperature=0.0, seed=0, k=3):
    call = ProposeCall(seq_id, start, tokens, k, SamplingParams(temperature, seed=seed))
    return engine_request("draft_model", calls.propose_inputs(call),
                          [names.DRAFT_TOKENS, names.DRAFT_PROBS])


def test_draft_batch_errors_are_per_request(serving):
    draft = serving.draft
    req = propose_request
    batch = [
        req(1, 0, [5, 6, 7], temperature=0.7, seed=3),
        req(2, 4, [8]),                                   # never opened, start_position > 0
        req(3, 0, [9, 10]),
        req(3, 0, [9, 10]),                               # the same sequence twice in a batch
        req(4, 0, [10**6]),                               # token id out of range
        req(5, 0, [1], k=0),                              # nothing to draft
    ]
    responses = draft.execute(batch)
    assert len(responses) == len(batch)
    ok = [not r.has_error() for r in responses]
    assert ok == [True, False, True, False, False, False]
    assert "not open" in responses[1].error().message()
    assert "twice" in responses[3].error().message()
    assert "out of range" in responses[4].error().message()
    assert "nothing to draft" in responses[5].error().message()
    assert all(r.error().code() == fake_pb.TritonError.INTERNAL for r in responses if r.has_error())
    fake_pb.ModelConfig("draft_model").check_outputs(responses[0].output_tensors())
    tokens1 = out(responses[0], names.DRAFT_TOKENS)
    probs1 = out(responses[0], names.DRAFT_PROBS)
    tokens3 = out(responses[2], names.DRAFT_TOKENS)
    assert tokens1.shape == (1, 3) and probs1.shape[:2] == (1, 3)
    assert np.allclose(probs1.sum(-1), 1, atol=1e-4)
    assert fake_pb.get_output_tensor_by_name(responses[2], names.DRAFT_PROBS) is None  # greedy
    assert draft.engine.pool.active == 2                   # sequences 1 and 3

    # Alone, in a fresh model, the good requests give the same drafts: the bad ones did not
    # disturb the batch.
    release = [engine_request("draft_model", calls.release_inputs(s), []) for s in (1, 3, 2)]
    assert not any(r.has_error() for r in draft.execute(release))   # 2: release of unknown id
    assert draft.engine.pool.active == 0
    (alone1,) = draft.execute([batch[0]])
    (alone3,) = draft.execute([batch[2]])
    assert np.array_equal(out(alone1, names.DRAFT_TOKENS), tokens1)
    assert np.allclose(out(alone1, names.DRAFT_PROBS), probs1, atol=1e-5)
    assert np.array_equal(out(alone3, names.DRAFT_TOKENS), tokens3)


def test_target_errors_are_per_row_and_per_request(serving):
    """A round's verifications in one request (calls.py): a row that fails fails alone, the
    other rows' sequences move on; a request that cannot be read fails alone in its batch."""
    target = serving.target

    def call(seq, start, toks, drafts):
        return VerifyCall(seq, start, toks, drafts, None, SamplingParams())

    def req(*cs):
        return engine_request("target_model", calls.verify_inputs(list(cs)), [names.VERDICT])

    bad = calls.verify_inputs([call(4, 0, [1], [])])
    bad[names.CALL] = bad[names.CALL][:, :4]   # 4 values, not 10
    unreadable = engine_request("target_model", bad, [names.VERDICT])
    responses = target.execute([req(call(1, 0, [5, 6, 7], [8, 9]), call(2, 3, [4], [1]),
                                    call(3, 0, [11], [])), unreadable,
                                req(call(5, 0, [12, 13], [14]))])
    assert [r.has_error() for r in responses] == [False, True, False]
    assert "expected [rows, 12]" in responses[1].error().message()
    fake_pb.ModelConfig("target_model").check_outputs(responses[0].output_tensors())
    rows = calls.verdicts(out(responses[0], names.VERDICT)) + \
        calls.verdicts(out(responses[2], names.VERDICT))
    assert isinstance(rows[1], SlotError) and "not open" in str(rows[1])
    assert not rows[1].unavailable
    for v, k in zip((rows[0], rows[2], rows[3]), (2, 0, 1)):
        assert len(v.tokens) == v.num_accepted + 1 and 0 <= v.num_accepted <= k
    assert target.engine.pool.active == 3   # sequences 1, 3 and 5


def test_release_request_frees_the_slot(serving):
    async def main():
        drafter = serving.orchestrator().drafter
        await drafter.propose(ProposeCall(77, 0, [1, 2, 3], 2, SamplingParams()))
        assert serving.draft.engine.pool.active == 1
        await drafter.release(77)
        assert serving.draft.engine.pool.active == 0
        await drafter.release(77)          # releasing twice is harmless

    asyncio.run(main())


@pytest.mark.parametrize("proposer", ["draft", "ngram", "hybrid"])
def test_every_proposer_gives_the_targets_greedy_output(serving, proposer):
    orch = serving.orchestrator()
    repeating = [5, 17, 200, 33, 9, 5, 17, 200, 33, 9, 5, 17]     # lookup finds matches here
    prompts = [repeating, PROMPTS[2]]
    plain = [orchestrator_request(p, max_tokens=24, num_draft_tokens=0) for p in prompts]
    # A fixed k: hybrid then takes every lookup match (auto would weigh it against the draft).
    spec = [orchestrator_request(p, max_tokens=24, proposer=proposer, num_draft_tokens=4)
            for p in prompts]
    run_all(orch, plain + spec)
    assert [output_ids(r) for r in spec] == [output_ids(r) for r in plain]
    lookups = sum(int(out(r.sender.responses()[-1], names.NGRAM_DRAFT_TOKENS)[0]) for r in spec)
    assert (lookups > 0) == (proposer != "draft")
    assert_all_released(serving)


def test_a_server_without_a_draft_serves_lookup_and_names_the_field_otherwise(
        serving, checkpoints, monkeypatch):
    from specdec.serving.engine_model import DraftModel
    from tests.adapters.conftest import engine_config
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", "none")
    disabled = DraftModel(fake_pb, engine_config(checkpoints, "draft"))
    assert disabled.engine is None
    fake_pb.register("draft_model", disabled, fake_pb.ModelConfig("draft_model"))
    orch = serving.orchestrator()
    ok = orchestrator_request(PROMPTS[0] * 3, max_tokens=16)
    bad = orchestrator_request(PROMPTS[0], max_tokens=16, proposer="draft")
    reference = orchestrator_request(PROMPTS[0] * 3, max_tokens=16, num_draft_tokens=0)
    run_all(orch, [ok, bad, reference])
    assert output_ids(ok) == output_ids(reference)
    (error,) = [r.error() for r in bad.sender.responses()]
    assert error.code() == fake_pb.TritonError.INVALID_ARG
    assert error.message().startswith("proposer: 'draft' needs a draft model")


def test_every_generation_can_have_a_bls_call_in_flight(serving):
    """Triton's async_exec blocks one thread of the event loop's default executor per BLS call;
    Python's default executor has min(32, CPUs + 4) threads (6 on the 2-core CI machine), which
    capped the calls in flight, and target_model's batches, at 16 streams. After its first
    request the orchestrator's loop runs a call for each of 32 generations at once (the stock
    executor would fail this on any host with fewer than 28 CPUs)."""
    import threading
    orch = serving.orchestrator(max_sequences=32)
    together = threading.Barrier(32, timeout=20)

    async def main():
        await orch.handle(orchestrator_request([], **{names.CANCEL_GENERATION: 5}))
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, together.wait) for _ in range(32)))

    asyncio.run(main())
    assert not together.broken
