"""TensorRT-LLM-format requests, built as Triton's own OpenAI frontend builds them
(python/openai/openai_frontend/engine/utils/triton.py, `_create_trtllm_*_request`): a batch
dimension first ([1, 1]; stop words [1, N]), `random_seed` in releases before 25.06 and `seed`
after, the optional `return_num_input_tokens`, `return_num_output_tokens` and
`exclude_input_in_output`. The ensemble serves them with the text it gives its own clients and
both token counts, and names what it does not implement."""
from __future__ import annotations

import queue

import numpy as np
import pytest

from specdec import names
from specdec.serving.tokenizer import load_tokenizer
from specdec_client import GenerationParams, generate
from tests.e2e.conftest import ROOT, heldout_prompts

PROMPT = heldout_prompts(2)[1]


def frontend_request(prompt: str, *, stream: bool, max_tokens: int, seed: int | None = None,
                     seed_name: str = "seed", stop: list[str] | None = None,
                     temperature: float | None = None, top_p: float | None = None,
                     extra: dict | None = None) -> dict[str, np.ndarray]:
    """The inputs as that frontend fills them: every value wrapped in a batch of one."""
    inputs = {"text_input": np.array([[prompt.encode()]], dtype=object),
              "stream": np.bool_([[stream]]), "max_tokens": np.int32([[max_tokens]])}
    if stop:
        inputs["stop_words"] = np.array([[w.encode() for w in stop]], dtype=object)
    if top_p is not None:
        inputs["top_p"] = np.float32([[top_p]])
    if seed is not None:
        inputs[seed_name] = np.uint64([[seed]])
    if temperature is not None:
        inputs["temperature"] = np.float32([[temperature]])
    inputs.update(extra or {})
    return inputs


DATATYPES = {np.dtype(object): "BYTES", np.dtype(np.bool_): "BOOL", np.dtype(np.int32): "INT32",
             np.dtype(np.uint64): "UINT64", np.dtype(np.float32): "FP32"}


def send(server, inputs: dict[str, np.ndarray]) -> tuple[list, str | None]:
    """Stream one request: (the responses' outputs, the error message or None)."""
    import tritonclient.grpc as grpcclient

    from specdec_client.grpc_transport import close_stream
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    tensors = []
    for name, array in inputs.items():
        t = grpcclient.InferInput(name, list(array.shape), DATATYPES[array.dtype])
        t.set_data_from_numpy(array)
        tensors.append(t)
    out = []
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        client.async_stream_infer(names.ENSEMBLE, tensors, enable_empty_final_response=True)
        while True:
            result, error = answers.get(timeout=120)
            if error is not None:
                return out, error.message()
            text = result.as_numpy(names.TEXT_OUTPUT)
            if text is not None:
                out.append({n: result.as_numpy(n) for n in (
                    names.TEXT_OUTPUT, names.NUM_INPUT_TOKENS, names.NUM_OUTPUT_TOKENS)})
            if result.get_response().parameters["triton_final_response"].bool_param:
                return out, None
    finally:
        close_stream(client)
        client.close()


def text_of(responses: list) -> str:
    # The frontend reads text_output as one string (a tensor of volume 1) per response.
    for r in responses:
        assert r[names.TEXT_OUTPUT].size == 1, r[names.TEXT_OUTPUT].shape
    return "".join(r[names.TEXT_OUTPUT].reshape(-1)[0].decode() for r in responses)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("seed_name", ["random_seed", "seed"])   # before 25.06, after
def test_frontend_requests_get_the_ensembles_own_text_and_both_counts(server, stream, seed_name):
    ours = generate(server.http, PROMPT, GenerationParams(max_tokens=24, temperature=0.0))
    extra = {} if seed_name == "random_seed" else {
        "return_num_input_tokens": np.bool_([[True]]),
        "return_num_output_tokens": np.bool_([[True]]),
        "exclude_input_in_output": np.bool_([[True]])}
    responses, error = send(server, frontend_request(
        PROMPT, stream=stream, max_tokens=24, seed=7, seed_name=seed_name, temperature=0.0,
        top_p=1.0, stop=[], extra=extra))
    assert error is None, error
    assert len(responses) > 1 if stream else len(responses) == 1
    assert text_of(responses) == ours.text
    tokenizer = load_tokenizer(ROOT / "models" / "default" / "target")
    last = responses[-1]
    assert int(last[names.NUM_INPUT_TOKENS].reshape(-1)[0]) == len(tokenizer(PROMPT)["input_ids"])
    assert int(last[names.NUM_OUTPUT_TOKENS].reshape(-1)[0]) == ours.num_output_tokens


def test_usage_summed_over_a_stream_as_the_frontend_sums_it_is_the_count(server):
    """Triton's OpenAI frontend adds up num_output_tokens over the responses of a stream that
    carry both counts, taking num_input_tokens from the first (vLLM's and TensorRT-LLM's
    convention: a response counts its own tokens). Both ride on the last response alone
    (num_output_tokens, so far, on every one), so that sum is the generation's count, not a
    sum of running totals."""
    ours = generate(server.http, PROMPT, GenerationParams(max_tokens=24, temperature=0.0))
    responses, error = send(server, frontend_request(PROMPT, stream=True, max_tokens=24,
                                                     temperature=0.0))
    assert error is None, error
    counted = [r for r in responses if r[names.NUM_INPUT_TOKENS] is not None
               and r[names.NUM_OUTPUT_TOKENS] is not None]
    assert len(responses) > 1 and len(counted) == 1 and counted[0] is responses[-1]
    completion = sum(int(r[names.NUM_OUTPUT_TOKENS].reshape(-1)[0]) for r in counted)
    assert completion == ours.num_output_tokens == 24
    assert int(counted[0][names.NUM_INPUT_TOKENS].reshape(-1)[0]) == ours.num_input_tokens


def test_stop_words_and_a_sampling_seed_as_the_frontend_sends_them(server):
    first = generate(server.http, PROMPT, GenerationParams(max_tokens=16, temperature=0.0)).text
    stop = first.strip().split()[1]
    ours = generate(server.http, PROMPT, GenerationParams(max_tokens=16, temperature=0.0,
                                                          stop_words=[stop]))
    responses, error = send(server, frontend_request(PROMPT, stream=True, max_tokens=16,
                                                     temperature=0.0, stop=[stop]))
    assert error is None and text_of(responses) == ours.text
    assert ours.finish_reason == "stop"
    # The same seed by either name samples the same text; the ensemble's own client agrees.
    sampled = generate(server.http, PROMPT, GenerationParams(max_tokens=16, temperature=0.8,
                                                             seed=11))
    for seed_name in ("random_seed", "seed"):
        responses, error = send(server, frontend_request(
            PROMPT, stream=False, max_tokens=16, temperature=0.8, seed=11, seed_name=seed_name))
        assert error is None and text_of(responses) == sampled.text


@pytest.mark.parametrize("extra, field", [
    ({"frequency_penalty": np.float32([[0.5]])}, "frequency_penalty"),
    ({"presence_penalty": np.float32([[-1.0]])}, "presence_penalty"),
    ({"exclude_input_in_output": np.bool_([[False]])}, "exclude_input_in_output"),
    ({"bad_words": np.array([[b"import"]], dtype=object)}, "bad_words"),
    ({"seed": np.uint64([[1]]), "random_seed": np.uint64([[2]])}, "random_seed")])
def test_what_is_not_implemented_is_refused_by_name(server, extra, field):
    responses, error = send(server, frontend_request(PROMPT, stream=True, max_tokens=8,
                                                     extra=extra))
    assert responses == [] and error is not None and f"{field}:" in error, error


def test_zero_penalties_empty_bad_words_and_empty_stop_words_are_plain_requests(server):
    ours = generate(server.http, PROMPT, GenerationParams(max_tokens=8, temperature=0.0))
    responses, error = send(server, frontend_request(PROMPT, stream=True, max_tokens=8, extra={
        "frequency_penalty": np.float32([[0.0]]), "presence_penalty": np.float32([[0.0]]),
        "bad_words": np.array([[b""]], dtype=object),
        "stop_words": np.array([[b""]], dtype=object)}))
    assert error is None and text_of(responses) == ours.text
