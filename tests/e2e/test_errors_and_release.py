"""Bad input is that request's 400, named; cancelled and finished requests free their slots."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from specdec_client import GenerationParams, generate, generate_stream
from tests.e2e.conftest import heldout_prompts, post, wait_for

GOOD = {"text_input": "def main():", "max_tokens": 8}

BAD = [
    ({"text_input": ""}, "text_input"),
    ({"text_input": None}, "text_input"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -3}, "top_k"),
    ({"num_draft_tokens": -2}, "num_draft_tokens"),
    ({"num_draft_tokens": 99}, "num_draft_tokens"),
    ({"text_input": "x " * 3000}, "context window"),
]


@pytest.mark.parametrize("change,field", BAD, ids=[f for _, f in BAD])
def test_bad_input_is_a_named_400(server, change, field):
    body = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    status, reply = post(server, "/v2/models/ensemble/generate", body)
    assert status == 400, reply
    assert field in reply["error"]


@pytest.mark.parametrize("name,dtype,shape", [
    ("max_tokens", "INT64", [1, 1]), ("temperature", "FP32", [1, 2]), ("seed", "INT32", [1, 1]),
    ("max_tokens", "INT32", [1])])   # no batch dimension: the ensemble's tensors are [1, 1]
def test_wrong_dtype_or_shape_is_refused_naming_the_input(server, name, dtype, shape):
    import numpy as np
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import triton_to_np_dtype
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"def f():"]], dtype=object))
    bad = grpcclient.InferInput(name, shape, dtype)
    bad.set_data_from_numpy(np.ones(shape, dtype=triton_to_np_dtype(dtype)))
    from specdec_client.grpc_transport import close_stream
    errors = []
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        client.start_stream(callback=lambda result, error: errors.append(error))
        client.async_stream_infer("ensemble", [text, bad])
        assert wait_for(lambda: errors)
    finally:
        close_stream(client)
        client.close()
    assert errors[0] is not None and name in errors[0].message()


def test_invalid_utf8_is_a_named_400(server):
    from tritonclient.utils import InferenceServerException
    import numpy as np
    import tritonclient.http as httpclient
    client = httpclient.InferenceServerClient(server.http)
    text = httpclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"\xff\xfe bad"], dtype=object))
    with pytest.raises(InferenceServerException) as err:
        client.infer("preprocessing", [text])
    assert "text_input" in str(err.value) and "UTF-8" in str(err.value)


def test_bad_requests_do_not_disturb_good_ones(server):
    bodies = [GOOD if i % 2 else {**GOOD, "top_p": 2.0} for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda b: post(server, "/v2/models/ensemble/generate", b), bodies))
    for body, (status, reply) in zip(bodies, replies):
        assert status == (200 if body is GOOD else 400), reply
    assert generate(server.http, GOOD["text_input"], GenerationParams(max_tokens=8)).text


def test_cancelled_sse_stream_releases_its_sequence(server):
    """Cancelling over HTTP closes the connection. gRPC cancellation is tested on a server of
    its own (test_disconnect_storm.py): on Triton before 2.57 it can crash the server."""
    prompt = heldout_prompts(1)[0]
    # The draft model drafts (its slot must be freed too), without lookups: the default
    # target's loops, drafted in full by a lookup, could end 1000 tokens before the cancel.
    stream = generate_stream(server.http, prompt,
                             GenerationParams(max_tokens=1000, num_draft_tokens=4,
                                              proposer="draft"))
    next(iter(stream))
    assert server.metric("specdec_active_sequences") == 1
    stream.cancel()
    assert wait_for(lambda: server.metric("specdec_active_sequences") == 0)
    assert wait_for(lambda: server.metric("specdec_kv_slots_used", model="target_model") == 0)
    assert server.metric("specdec_kv_slots_used", model="draft_model") == 0
    # The server still serves.
    assert generate(server.http, prompt, GenerationParams(max_tokens=4)).num_output_tokens == 4


def test_finished_and_failed_requests_release_their_sequences(server):
    generate(server.http, "import os", GenerationParams(max_tokens=16, num_draft_tokens=3))
    post(server, "/v2/models/ensemble/generate", {**GOOD, "top_k": -1})
    assert wait_for(lambda: server.metric("specdec_active_sequences") == 0)
    assert server.metric("specdec_kv_slots_used", model="target_model") == 0
    assert server.metric("specdec_kv_slots_total", model="target_model") > 0
