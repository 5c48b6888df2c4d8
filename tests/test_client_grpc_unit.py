"""Unit tests of specdec_client's gRPC transport against a stand-in gRPC server on 127.0.0.1:
encoding, streaming, errors, cancellation, and closing streams cleanly (docs/reliability.md)."""

from __future__ import annotations

import codecs
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor  # noqa: E402

from specdec_client import GenerationParams, ServerError, grpc_generate, grpc_stream  # noqa: E402
from specdec_client import api, grpc_transport  # noqa: E402
from tests.test_client_unit import ALL_PARAMS  # noqa: E402

def test_infer_inputs_names_dtypes_shapes() -> None:
    inputs = {i.name(): (i.datatype(), list(i.shape())) for i in
              grpc_transport.build_infer_inputs("hi", ALL_PARAMS, stream=True)}
    assert inputs == {
        "text_input": ("BYTES", [1]), "stream": ("BOOL", [1]),
        "max_tokens": ("INT32", [1]), "temperature": ("FP32", [1]),
        "top_p": ("FP32", [1]), "top_k": ("INT32", [1]), "seed": ("UINT64", [1]),
        "num_draft_tokens": ("INT32", [1]), "stop_words": ("BYTES", [2]),
    }


def test_infer_inputs_take_the_ranks_a_model_declares() -> None:
    ranks = {name: 2 for name in api.INPUT_DATATYPES}
    inputs = {i.name(): list(i.shape()) for i in
              grpc_transport.build_infer_inputs("hi", ALL_PARAMS, True, ranks)}
    assert inputs["text_input"] == [1, 1] and inputs["stop_words"] == [1, 2]
    assert all(shape[0] == 1 and len(shape) == 2 for shape in inputs.values())


def test_infer_inputs_leave_out_unset_params() -> None:
    names = [i.name() for i in grpc_transport.build_infer_inputs("hi", GenerationParams(top_k=1))]
    assert sorted(names) == ["stream", "text_input", "top_k"]


def _infer_response(text: bytes | None = None, stats: dict[str, Any] | None = None,
                    final: bool = False, request_id: str = "") -> service_pb2.ModelInferResponse:
    r = service_pb2.ModelInferResponse(model_name="ensemble", id=request_id)
    tensors: dict[str, tuple[str, np.ndarray]] = {}
    if text is not None:
        tensors["text_output"] = ("BYTES", np.array([[text]], dtype=np.object_))
    for name, value in (stats or {}).items():
        if name == "finish_reason":
            tensors[name] = ("BYTES", np.array([[value.encode()]], dtype=np.object_))
        elif name == "acceptance_rate":
            tensors[name] = ("FP32", np.array([[value]], dtype=np.float32))
        else:
            tensors[name] = ("INT32", np.array([[value]], dtype=np.int32))
    for name, (datatype, array) in tensors.items():
        out = r.outputs.add()
        out.name, out.datatype = name, datatype
        out.shape.extend(array.shape)
        raw = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        r.raw_output_contents.append(raw)
    r.parameters["triton_final_response"].bool_param = final
    return r


def test_outputs_from_infer_result_keeps_split_utf8_character() -> None:
    euro = "€".encode()
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    decode = grpc_transport.outputs_from_infer_result
    first = decode(InferResult(_infer_response(b"a" + euro[:2])), decoder)
    second = decode(InferResult(_infer_response(euro[2:], {"num_output_tokens": 2,
                                                           "acceptance_rate": 0.25,
                                                           "finish_reason": "stop"})),
                    decoder, final=True)
    assert first == {"text_output": "a"}
    assert second["text_output"] == "€"
    assert second["num_output_tokens"] == 2 and isinstance(second["num_output_tokens"], int)
    assert second["acceptance_rate"] == 0.25 and second["finish_reason"] == "stop"


# ---------------------------------------------------------------- gRPC stand-in

@dataclass
class GrpcStandIn:
    url: str
    script: list[Callable[[service_pb2.ModelInferRequest, Any],
                          Iterator[service_pb2.ModelStreamInferResponse]]]
    requests: list[service_pb2.ModelInferRequest]
    cancelled: threading.Event
    """Set by scripts when the RPC ends before they finish."""
    version: list[str]
    """The version the server's metadata reports (a list so that tests can change it)."""
    headers: list[dict[str, str]]
    """The metadata each stream was opened with."""
    ended: list[str]
    """How each stream ended on the server: "done" (the client half-closed and the servicer
    returned) or "cancelled"."""


@pytest.fixture
def grpc_server() -> Iterator[GrpcStandIn]:
    requests: list[service_pb2.ModelInferRequest] = []
    cancelled = threading.Event()
    script: list[Any] = []
    version = ["2.51.0"]
    headers: list[dict[str, str]] = []
    ended: list[str] = []

    class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
        def ServerMetadata(self, request: Any, context: Any) -> Any:
            return service_pb2.ServerMetadataResponse(name="triton", version=version[0])

        def ModelMetadata(self, request: Any, context: Any) -> Any:
            """The ensemble's inputs: a batch dimension first (max_batch_size 1)."""
            meta = service_pb2.ModelMetadataResponse(name=request.name)
            for name, datatype in api.INPUT_DATATYPES.items():
                meta.inputs.add(name=name, datatype=datatype,
                                shape=[-1, -1 if name == "stop_words" else 1])
            return meta

        def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
            headers.append(dict(context.invocation_metadata()))
            clean = []
            context.add_callback(lambda: ended.append("done" if clean else "cancelled"))
            for request in request_iterator:
                requests.append(request)
                yield from script[0](request, context)
            if context.is_active():   # the client half-closed: the stream ends here, not cut
                clean.append(True)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    grpc_transport._facts.clear()
    try:
        yield GrpcStandIn(f"127.0.0.1:{port}", script, requests, cancelled, version, headers,
                          ended)
    finally:
        server.stop(0)


def _stream_reply(text: bytes | None = None, stats: dict[str, Any] | None = None,
                  final: bool = False) -> service_pb2.ModelStreamInferResponse:
    return service_pb2.ModelStreamInferResponse(infer_response=_infer_response(text, stats, final))


def _three_pieces(request: Any, context: Any) -> Iterator[Any]:
    yield _stream_reply(b"Hel", {"num_output_tokens": 1, "total_draft_tokens": 4,
                                 "total_accepted_draft_tokens": 0, "acceptance_rate": 0.0,
                                 "finish_reason": ""})
    yield _stream_reply(b"lo", {"num_output_tokens": 3, "total_draft_tokens": 4,
                                "total_accepted_draft_tokens": 3, "acceptance_rate": 0.75,
                                "finish_reason": "stop"})
    yield _stream_reply(final=True)


def _request_inputs(request: service_pb2.ModelInferRequest) -> dict[str, Any]:
    out = {}
    for i, tensor in enumerate(request.inputs):
        raw = request.raw_input_contents[i]
        if tensor.datatype == "BYTES":
            value = deserialize_bytes_tensor(raw).tolist()
        else:
            value = np.frombuffer(raw, dtype={"BOOL": np.bool_, "INT32": np.int32,
                                              "FP32": np.float32, "UINT64": np.uint64}
                                  [tensor.datatype]).tolist()
        out[tensor.name] = (tensor.datatype, list(tensor.shape), value)
    return out


def test_grpc_stream_round_trip(grpc_server: GrpcStandIn) -> None:
    grpc_server.script.append(_three_pieces)
    stream = grpc_stream(grpc_server.url, "Hi", ALL_PARAMS)
    pieces = list(stream)
    result = stream.result
    assert pieces == ["Hel", "lo"]
    assert result is not None and result.text == "Hello"
    assert (result.num_output_tokens, result.total_accepted_draft_tokens, result.acceptance_rate,
            result.finish_reason) == (3, 3, 0.75, "stop")
    assert result.time_to_first_token_s is not None
    request = grpc_server.requests[0]
    assert request.model_name == "ensemble"
    assert request.parameters["triton_enable_empty_final_response"].bool_param
    # Shaped as the model's metadata says: the ensemble's batch dimension first.
    assert _request_inputs(request) == {
        "text_input": ("BYTES", [1, 1], [b"Hi"]), "stream": ("BOOL", [1, 1], [True]),
        "max_tokens": ("INT32", [1, 1], [16]),
        "temperature": ("FP32", [1, 1], [pytest.approx(0.7)]),
        "top_p": ("FP32", [1, 1], [pytest.approx(0.9)]), "top_k": ("INT32", [1, 1], [40]),
        "seed": ("UINT64", [1, 1], [2**63 + 5]), "num_draft_tokens": ("INT32", [1, 1], [4]),
        "stop_words": ("BYTES", [1, 2], [b"\n\n", b"END"]),
    }


def test_grpc_generate_sends_stream_false(grpc_server: GrpcStandIn) -> None:
    grpc_server.script.append(lambda req, ctx: iter([_stream_reply(
        b"whole text", {"num_output_tokens": 2, "finish_reason": "eos"}, final=True)]))
    result = grpc_generate(grpc_server.url, "Hi", model="other")
    assert result.text == "whole text" and result.finish_reason == "eos"
    assert result.time_to_first_token_s is None
    request = grpc_server.requests[0]
    assert request.model_name == "other"
    assert _request_inputs(request)["stream"] == ("BOOL", [1, 1], [False])


def test_grpc_error_response_raises_and_closes_the_stream_cleanly(
        grpc_server: GrpcStandIn) -> None:
    """An error is its request's last response: the client half-closes and the server ends the
    stream, no cancellation (docs/reliability.md)."""
    grpc_server.script.append(lambda req, ctx: iter([
        _stream_reply(b"ok"),
        service_pb2.ModelStreamInferResponse(error_message="draft model failed")]))
    stream = grpc_stream(grpc_server.url, "Hi")
    assert next(stream) == "ok"
    with pytest.raises(ServerError, match="draft model failed") as e:
        next(stream)
    assert e.value.status is None and not e.value.retryable
    assert _ended(grpc_server) == ["done"]


def test_retryable_error_without_status_codes_is_told_by_its_marker(
        grpc_server: GrpcStandIn) -> None:
    grpc_server.script.append(lambda req, ctx: iter([service_pb2.ModelStreamInferResponse(
        error_message="in ensemble 'ensemble', UNAVAILABLE: all 2 sequence slots stayed busy")]))
    with pytest.raises(ServerError) as e:
        grpc_generate(grpc_server.url, "Hi")
    assert e.value.status is None and e.value.retryable
    assert _ended(grpc_server) == ["done"]


def _ended(server: GrpcStandIn, n: int = 1) -> list[str]:
    """How the first n streams ended on the server, once they have."""
    deadline = time.monotonic() + 5
    while len(server.ended) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return server.ended


@pytest.mark.parametrize("version, header", [("2.51.0", False), ("2.67.0", False),
                                             ("2.68.0", True), ("2.70.1", True),
                                             ("unreadable", False)])
def test_status_codes_are_asked_only_of_a_server_without_the_crash(
        grpc_server: GrpcStandIn, version: str, header: bool) -> None:
    """The triton_grpc_error mode can crash Triton before 2.68 (server pull request 8708)."""
    grpc_server.version[0] = version
    grpc_server.script.append(_three_pieces)
    assert grpc_stream(grpc_server.url, "Hi").wait().text == "Hello"
    assert (grpc_server.headers[0].get("triton_grpc_error") == "true") is header
    assert _ended(grpc_server) == ["done"]


def test_server_version_is_read_once_a_minute_per_address(grpc_server: GrpcStandIn,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    grpc_server.script.append(_three_pieces)
    grpc_stream(grpc_server.url, "Hi").wait()
    grpc_server.version[0] = "2.70.0"
    grpc_stream(grpc_server.url, "Hi").wait()
    assert "triton_grpc_error" not in grpc_server.headers[1]      # remembered: 2.51
    clock = time.monotonic() + 61
    monkeypatch.setattr(grpc_transport.time, "monotonic", lambda: clock)
    grpc_stream(grpc_server.url, "Hi").wait()
    assert grpc_server.headers[2].get("triton_grpc_error") == "true"


def test_parse_version() -> None:
    assert grpc_transport.parse_version("2.51.0") == (2, 51, 0)
    assert grpc_transport.parse_version("2.68.0-dev") == (2, 68, 0)
    assert grpc_transport.parse_version("") == (0,)


def test_a_timed_out_stream_is_cut(grpc_server: GrpcStandIn) -> None:
    def silent(request: Any, context: Any) -> Iterator[Any]:
        while context.is_active():
            time.sleep(0.02)
        return
        yield
    grpc_server.script.append(silent)
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        grpc_generate(grpc_server.url, "Hi", timeout=0.5)
    assert time.monotonic() - start < 5
    assert _ended(grpc_server) == ["cancelled"]


def test_a_clean_close_cuts_a_request_that_does_not_end(grpc_server: GrpcStandIn) -> None:
    """close_stream waits grace_s for the server to end the stream, then cancels: a close
    never hangs."""
    from tritonclient.grpc import InferenceServerClient

    def endless(request: Any, context: Any) -> Iterator[Any]:
        yield _stream_reply(b"first")
        while context.is_active():
            time.sleep(0.02)
    grpc_server.script.append(endless)
    first = threading.Event()
    client = InferenceServerClient(grpc_server.url)
    try:
        client.start_stream(callback=lambda result, error: first.set())
        client.async_stream_infer("ensemble", grpc_transport.build_infer_inputs("Hi"))
        assert first.wait(5)
        start = time.monotonic()
        assert grpc_transport.close_stream(client, grace_s=0.5) is False
        assert 0.4 < time.monotonic() - start < 5
    finally:
        client.close()
    assert _ended(grpc_server) == ["cancelled"]


@pytest.fixture
def stop_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """cancel_requests of every stop_stream call that closes a stream. Calls on a client with
    no stream are left out: an earlier test's client that the garbage collector closes during
    this one calls stop_stream too."""
    from tritonclient.grpc import InferenceServerClient

    calls: list[bool] = []
    original = InferenceServerClient.stop_stream

    def spy(self: Any, cancel_requests: bool = False) -> None:
        if getattr(self, "_stream", None) is not None:
            calls.append(cancel_requests)
        original(self, cancel_requests=cancel_requests)

    monkeypatch.setattr(InferenceServerClient, "stop_stream", spy)
    return calls


def test_grpc_cancel_stops_the_stream_with_cancel_requests(
        grpc_server: GrpcStandIn, stop_calls: list[bool]) -> None:

    def endless(request: Any, context: Any) -> Iterator[Any]:
        context.add_callback(grpc_server.cancelled.set)
        yield _stream_reply(b"first", {"num_output_tokens": 1})
        deadline = time.monotonic() + 10
        while context.is_active() and time.monotonic() < deadline:
            time.sleep(0.02)

    grpc_server.script.append(endless)
    start = time.monotonic()
    with grpc_stream(grpc_server.url, "Hi") as stream:
        assert next(stream) == "first"
        stream.cancel()
        assert list(stream) == []
    assert time.monotonic() - start < 5
    assert stop_calls and stop_calls[0] is True
    assert stream.result is not None and stream.result.finish_reason == "cancelled"
    assert stream.result.text == "first" and stream.result.num_output_tokens == 1
    assert grpc_server.cancelled.wait(5)
    assert _ended(grpc_server) == ["cancelled"]


def test_a_finished_stream_is_closed_without_cancelling(
        grpc_server: GrpcStandIn, stop_calls: list[bool]) -> None:
    grpc_server.script.append(_three_pieces)
    with grpc_stream(grpc_server.url, "Hi") as stream:
        assert "".join(stream) == "Hello"
    assert True not in stop_calls
    assert _ended(grpc_server) == ["done"]


def test_grpc_unreachable_server_raises_server_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError) as e:
        grpc_generate(f"127.0.0.1:{port}", "Hi", timeout=10)
    assert "UNAVAILABLE" in str(e.value.status)

