"""Hostile input, property-based (hypothesis), on the session's real tritonserver.

HTTP generate gets random JSON bodies and raw bytes; gRPC streaming gets random tensors (names,
datatypes, shapes, NaN/inf, extreme integers, random bytes). Every answer must be a refusal of
the input or a generation, never a server error, a hang or a crash; afterwards the server still
gives the target's exact greedy output. Triton's own JSON conversion answers 500 for a value of
the wrong JSON type before any model runs (docs/reliability.md): that, and only that, is allowed
to be a 500.
"""
from __future__ import annotations

import json
import queue

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specdec import names  # noqa: E402
from specdec.serving.probe import probe  # noqa: E402
from specdec_client import GenerationParams, generate  # noqa: E402
from tests.e2e.conftest import heldout_prompts, post_raw, wait_for  # noqa: E402

FIELDS = (names.TEXT_INPUT, names.MAX_TOKENS, names.STREAM, names.TEMPERATURE, names.TOP_P,
          names.TOP_K, names.SEED, names.NUM_DRAFT_TOKENS, names.STOP_WORDS)
# Triton's HTTP frontend, converting JSON to tensors before any model sees the request.
FRONTEND_500 = ("Unable to parse", "failed to parse the request JSON", "attempt to ")
FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

huge_text = st.sampled_from([0, 1, 4000, 1 << 20, (1 << 20) + 1]).map(lambda n: "x" * n)
numbers = st.one_of(st.integers(-2**70, 2**70), st.integers(-3, 12),
                    st.floats(allow_nan=True, allow_infinity=True), st.booleans())
values = st.one_of(numbers, st.none(), st.text(max_size=40), huge_text,
                   st.lists(st.one_of(numbers, st.text(max_size=8)), max_size=4),
                   st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
stop_words = st.one_of(st.lists(st.text(max_size=20), max_size=8),
                       st.integers(60, 4000).map(lambda n: [f"w{i}" for i in range(n)]),
                       st.lists(st.text(min_size=200, max_size=400), min_size=1, max_size=2))
bodies = st.fixed_dictionaries(
    {names.TEXT_INPUT: st.one_of(st.text(max_size=300), huge_text, values)},
    optional={**{f: values for f in FIELDS[1:]}, names.STOP_WORDS: st.one_of(stop_words, values),
              names.MAX_TOKENS: st.one_of(st.integers(1, 8), values),
              "extra": values})


def assert_not_retryable(message: str, sent: bytes) -> None:
    """A refusal never reads as retryable, unless the marker is the request's own words echoed
    (Triton names an unexpected input: hypothesis once named one 'UNAVAILABLE:')."""
    assert names.UNAVAILABLE not in message or names.UNAVAILABLE.encode() in sent, message


def assert_refused_or_served(status: int, reply: dict, sent: bytes) -> None:
    if status == 200:
        assert names.TEXT_OUTPUT in reply and reply[names.FINISH_REASON], reply
        return
    error = reply.get("error", "")
    assert error, (status, reply)
    if status == 500:   # only Triton's JSON conversion, never a model
        assert error.startswith(FRONTEND_500) and "in ensemble" not in error, error
        return
    # Triton's generate endpoint answers 400 for any error (docs/reliability.md): a model's
    # refusal names the field; a server-side failure or a retryable answer is not bad input.
    assert status == 400, (status, error)
    assert "request failed" not in error, error
    assert_not_retryable(error, sent)
    if error.startswith("in ensemble"):
        field = error.split("', ", 1)[1]
        assert field.startswith(FIELDS + (names.INPUT_IDS,)), error


@FUZZ
@given(body=bodies)
def test_random_json_bodies_are_refused_or_served(server, body):
    data = json.dumps(body).encode()   # NaN and Infinity included: not JSON, Triton parses them
    assert_refused_or_served(*post_raw(server, "/v2/models/ensemble/generate", data), data)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), st.text(max_size=200).map(str.encode),
                      st.just(b'{"text_input": "\\ud800"}'), st.just(b"[1, 2]"), st.just(b"")))
def test_random_bytes_are_refused(server, data):
    status, reply = post_raw(server, "/v2/models/ensemble/generate", data)
    assert status != 200 or names.TEXT_OUTPUT in reply
    assert_refused_or_served(status, reply, data)


DTYPES = ("BOOL", "INT8", "INT32", "INT64", "UINT64", "FP16", "FP32", "FP64", "BYTES")
ENSEMBLE_TYPES = {names.TEXT_INPUT: "BYTES", names.MAX_TOKENS: "INT32", names.STREAM: "BOOL",
                  names.TEMPERATURE: "FP32", names.TOP_P: "FP32", names.TOP_K: "INT32",
                  names.SEED: "UINT64", names.NUM_DRAFT_TOKENS: "INT32",
                  names.STOP_WORDS: "BYTES"}


@st.composite
def tensor(draw):
    name = draw(st.one_of(st.sampled_from(FIELDS), st.text(min_size=1, max_size=12)))
    right = ENSEMBLE_TYPES.get(name, "BYTES")
    dtype = draw(st.one_of(st.just(right), st.sampled_from(DTYPES)))
    shape = draw(st.one_of(st.just([1]), st.lists(st.integers(0, 3), min_size=0, max_size=3),
                           st.integers(1000, 100000).map(lambda n: [n])))
    size = int(np.prod(shape)) if shape else 1
    if dtype == "BYTES":
        word = draw(st.one_of(st.binary(max_size=30), st.text(max_size=30).map(str.encode)))
        return name, dtype, shape, np.array([word] * size, dtype=object).reshape(shape)
    np_type = {"BOOL": np.bool_, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
               "UINT64": np.uint64, "FP16": np.float16, "FP32": np.float32,
               "FP64": np.float64}[dtype]
    if dtype.startswith("FP"):
        value = draw(st.floats(allow_nan=True, allow_infinity=True, width=16 if dtype == "FP16"
                               else 32 if dtype == "FP32" else 64))
    elif dtype == "BOOL":
        value = draw(st.booleans())
    else:
        info = np.iinfo(np_type)
        value = draw(st.one_of(st.integers(int(info.min), int(info.max)), st.integers(-2, 8)))
    return name, dtype, shape, np.full(shape, value, dtype=np_type)


def grpc_call(server, tensors, timeout: float = 120.0):
    """One request on its own stream, closed cleanly (abrupt closes are the disconnect storm's
    job: tests/e2e/test_disconnect_storm.py): (error or None, responses)."""
    import tritonclient.grpc as grpcclient
    from specdec_client.grpc_transport import close_stream, server_version, stream_headers
    answers: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            headers=stream_headers(server_version(client, server.grpc)))
        inputs = []
        for name, dtype, shape, array in tensors:
            t = grpcclient.InferInput(name, list(shape), dtype)
            t.set_data_from_numpy(array)
            inputs.append(t)
        client.async_stream_infer(names.ENSEMBLE, inputs, enable_empty_final_response=True)
        got = 0
        while True:
            result, error = answers.get(timeout=timeout)   # queue.Empty: a hang
            if error is not None:
                return error, got
            got += 1
            params = result.get_response().parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                return None, got
    finally:
        close_stream(client)
        client.close()


@FUZZ
@given(tensors=st.lists(tensor(), min_size=0, max_size=5, unique_by=lambda t: t[0]))
@example(tensors=[(names.STREAM, "BOOL", [1], np.array([False])),   # a CI run's, 2026-11-28
                  (names.UNAVAILABLE, "BYTES", [1], np.array([b""], dtype=object))])
def test_random_tensors_over_grpc_are_refused_or_served(server, tensors):
    """A refusal: INVALID_ARGUMENT where the server sends status codes (Triton 2.68 and later);
    on older servers the message must not be retryable, and the server must log no failure of
    its own (checked after the fuzzing)."""
    error, _ = grpc_call(server, tensors)
    if error is None:
        return
    assert error.status() in (None, "StatusCode.INVALID_ARGUMENT"), error
    assert_not_retryable(error.message(), b"".join(
        name.encode() + b"".join(v for v in array.reshape(-1) if isinstance(v, bytes))
        for name, _, _, array in tensors))
    if error.message().startswith("in ensemble"):   # a model's refusal names the field
        assert error.message().split("', ", 1)[1].startswith(FIELDS + (names.INPUT_IDS,)), error


def test_the_server_is_whole_after_the_fuzzing(server):
    """Runs after the fuzz tests above (file order): exact output, every model answering, no
    sequence left holding a slot."""
    prompt = heldout_prompts(1)[0]
    plain = generate(server.http, prompt, GenerationParams(max_tokens=32, num_draft_tokens=0))
    spec = generate(server.http, prompt, GenerationParams(max_tokens=32, num_draft_tokens=4))
    assert spec.text == plain.text and spec.total_draft_tokens > 0
    assert all(p is None for p in probe(f"http://{server.http}", True, 10).values())
    assert wait_for(lambda: server.metric("specdec_active_sequences") == 0)
    for model in (names.DRAFT_MODEL, names.TARGET_MODEL):
        assert server.metric("specdec_kv_slots_used", model=model) == 0
    # Every refusal was a refusal: no model failed on its own (adapter.py logs each such failure).
    assert "request failed" not in server.log.read_text(errors="replace")
