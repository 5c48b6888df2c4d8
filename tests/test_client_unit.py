"""Unit tests of specdec_client that need no Triton server.

HTTP and gRPC are exercised end to end against tiny stand-in servers bound to
127.0.0.1, so framing, encoding and cancellation go over a real socket.
"""

from __future__ import annotations

import codecs
import io
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

grpc = pytest.importorskip("grpc")
from tritonclient.grpc import InferResult, service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor  # noqa: E402

from specdec_client import (  # noqa: E402
    GenerationParams,
    Result,
    ServerError,
    generate,
    generate_stream,
    grpc_generate,
    grpc_stream,
)
from specdec_client import api, cli, grpc_transport  # noqa: E402
from specdec_client.sse import iter_sse_data  # noqa: E402

ALL_PARAMS = GenerationParams(max_tokens=16, temperature=0.7, top_p=0.9, top_k=40, seed=2**63 + 5,
                              num_draft_tokens=4, stop_words=["\n\n", "END"])


# ---------------------------------------------------------------- encoding

def test_unset_params_are_not_sent() -> None:
    assert api.build_generate_body("hi", GenerationParams()) == \
        {"text_input": "hi", "stream": False}
    assert api.build_generate_body("hi", None, stream=True) == {"text_input": "hi", "stream": True}


def test_body_carries_every_set_param() -> None:
    body = api.build_generate_body("hi", ALL_PARAMS, stream=True)
    assert body == {"text_input": "hi", "stream": True, "max_tokens": 16, "temperature": 0.7,
                    "top_p": 0.9, "top_k": 40, "seed": 2**63 + 5, "num_draft_tokens": 4,
                    "stop_words": ["\n\n", "END"]}
    assert json.loads(json.dumps(body)) == body


def test_zero_values_are_sent_and_empty_stop_words_are_not() -> None:
    body = api.build_generate_body("x", GenerationParams(num_draft_tokens=0, temperature=0.0,
                                                         stop_words=[]))
    assert body == {"text_input": "x", "stream": False, "num_draft_tokens": 0, "temperature": 0.0}


@pytest.mark.parametrize("kwargs, error", [
    ({"max_tokens": 0}, ValueError),
    ({"max_tokens": 1.5}, TypeError),
    ({"top_p": 1.5}, ValueError),
    ({"temperature": -0.1}, ValueError),
    ({"temperature": math.nan}, ValueError),
    ({"top_k": -1}, ValueError),
    ({"seed": -1}, ValueError),
    ({"seed": 2**64}, ValueError),
    ({"num_draft_tokens": -2}, ValueError),
    ({"stop_words": "END"}, TypeError),
    ({"stop_words": ["a", 3]}, TypeError),
])
def test_invalid_params_are_rejected(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        GenerationParams(**kwargs)


def test_infer_inputs_names_dtypes_shapes() -> None:
    inputs = {i.name(): (i.datatype(), list(i.shape())) for i in
              grpc_transport.build_infer_inputs("hi", ALL_PARAMS, stream=True)}
    assert inputs == {
        "text_input": ("BYTES", [1]), "stream": ("BOOL", [1]),
        "max_tokens": ("INT32", [1]), "temperature": ("FP32", [1]),
        "top_p": ("FP32", [1]), "top_k": ("INT32", [1]), "seed": ("UINT64", [1]),
        "num_draft_tokens": ("INT32", [1]), "stop_words": ("BYTES", [2]),
    }


def test_infer_inputs_leave_out_unset_params() -> None:
    names = [i.name() for i in grpc_transport.build_infer_inputs("hi", GenerationParams(top_k=1))]
    assert sorted(names) == ["stream", "text_input", "top_k"]


# ---------------------------------------------------------------- parsing

def test_sse_events_split_on_blank_lines() -> None:
    lines = [b'data: {"a": 1}\r\n', b"\r\n", b'data: {"a": 2}\n', b"\n"]
    assert list(iter_sse_data(lines)) == ['{"a": 1}', '{"a": 2}']


def test_sse_multiline_data_is_joined_with_newlines() -> None:
    lines = ["data: {\"text_output\":\n", "data:  \"x\"}\n", "\n"]
    events = list(iter_sse_data(lines))
    assert events == ['{"text_output":\n "x"}']
    assert json.loads(events[0]) == {"text_output": "x"}


def test_sse_ignores_comments_and_other_fields() -> None:
    lines = [": keep-alive", "event: message", "id: 7", "retry: 10", "data:x", "", "", "data: y"]
    assert list(iter_sse_data(lines)) == ["x", "y"]


def test_decode_event_raises_server_error() -> None:
    with pytest.raises(ServerError) as e:
        api.decode_event('{"error": "model not ready"}')
    assert e.value.message == "model not ready" and e.value.status is None
    with pytest.raises(ServerError, match="malformed"):
        api.decode_event("not json")


def test_outputs_from_json_accepts_scalars_and_lists() -> None:
    obj = {"model_name": "ensemble", "text_output": [["he", "llo"]], "num_output_tokens": [3],
           "acceptance_rate": 0.5, "finish_reason": ["eos"]}
    assert api.outputs_from_json(obj) == {"text_output": "hello", "num_output_tokens": 3,
                                          "acceptance_rate": 0.5, "finish_reason": "eos"}


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


def test_result_derived_timings() -> None:
    r = Result(text="abc", num_output_tokens=10, total_time_s=2.0, chunk_times_s=[0.5, 0.75, 1.5])
    assert r.tokens_per_s == 5.0
    assert r.inter_chunk_latencies_s == [0.25, 0.75]
    assert Result(text="").tokens_per_s is None


# ---------------------------------------------------------------- HTTP stand-in

@dataclass
class Reply:
    status: int = 200
    json_body: Any = None
    events: list[str] = field(default_factory=list)
    """SSE writes, each sent as one HTTP chunk; after them `then` runs."""
    then: Callable[[BaseHTTPRequestHandler], None] | None = None


@dataclass
class HttpStandIn:
    url: str
    replies: dict[str, Reply]
    requests: list[tuple[str, dict[str, Any], dict[str, str]]]
    disconnected: threading.Event


@pytest.fixture
def http_server() -> Iterator[HttpStandIn]:
    replies: dict[str, Reply] = {}
    requests: list[tuple[str, dict[str, Any], dict[str, str]]] = []
    disconnected = threading.Event()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            requests.append((self.path, body, dict(self.headers)))
            reply = replies.get(self.path, Reply(status=404, json_body={"error": "no such model"}))
            if reply.json_body is not None:
                raw = json.dumps(reply.json_body).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)
                return
            self.send_response(reply.status)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                for chunk in reply.events:
                    self.write_chunk(chunk)
                    time.sleep(0.01)
                if reply.then is not None:
                    reply.then(self)
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                disconnected.set()

        def write_chunk(self, text: str) -> None:
            raw = text.encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(raw), raw))
            self.wfile.flush()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield HttpStandIn(f"127.0.0.1:{server.server_address[1]}", replies, requests, disconnected)
    finally:
        server.shutdown()
        server.server_close()


def _event(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj)}\n\n"


STREAM_EVENTS = [
    _event({"text_output": "Hel", "num_output_tokens": 1, "total_draft_tokens": 4,
            "total_accepted_draft_tokens": 0, "acceptance_rate": 0.0, "finish_reason": ""})
    + 'data: {"text_output": "lo", "num_output_tokens": 2,\n',
    'data: "total_draft_tokens": 8}\n\n',
    _event({"text_output": "", "num_output_tokens": 3, "total_draft_tokens": 8,
            "total_accepted_draft_tokens": 6, "acceptance_rate": 0.75,
            "finish_reason": "length"}),
]


def test_http_generate_round_trip(http_server: HttpStandIn) -> None:
    http_server.replies["/v2/models/ensemble/generate"] = Reply(json_body={
        "model_name": "ensemble", "text_output": "Hello", "num_output_tokens": 2,
        "total_draft_tokens": 4, "total_accepted_draft_tokens": 3, "acceptance_rate": 0.75,
        "finish_reason": "eos"})
    result = generate("http://" + http_server.url, "Hi", GenerationParams(max_tokens=8, seed=1))
    assert (result.text, result.num_output_tokens, result.total_draft_tokens,
            result.total_accepted_draft_tokens, result.acceptance_rate, result.finish_reason) == \
        ("Hello", 2, 4, 3, 0.75, "eos")
    assert result.time_to_first_token_s is None and result.total_time_s > 0
    path, body, headers = http_server.requests[0]
    assert path == "/v2/models/ensemble/generate"
    assert body == {"text_input": "Hi", "stream": False, "max_tokens": 8, "seed": 1}
    assert headers["Content-Type"] == "application/json"


def test_http_generate_quotes_model_name_and_reports_status(http_server: HttpStandIn) -> None:
    http_server.replies["/v2/models/a%2Fb/generate"] = Reply(
        status=400, json_body={"error": "unexpected input 'top_k'"})
    with pytest.raises(ServerError) as e:
        generate(http_server.url, "Hi", model="a/b")
    assert e.value.status == 400 and e.value.message == "unexpected input 'top_k'"
    assert "400" in str(e.value)


def test_http_stream_pieces_and_final_statistics(http_server: HttpStandIn) -> None:
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(events=STREAM_EVENTS)
    stream = generate_stream(http_server.url, "Hi", GenerationParams(num_draft_tokens=4))
    assert stream.result is None
    pieces = list(stream)
    result = stream.result
    assert pieces == ["Hel", "lo"]
    assert result is not None and result.text == "Hello"
    assert (result.num_output_tokens, result.total_draft_tokens,
            result.total_accepted_draft_tokens, result.acceptance_rate, result.finish_reason) == \
        (3, 8, 6, 0.75, "length")
    assert len(result.chunk_times_s) == 2
    assert result.time_to_first_token_s == result.chunk_times_s[0] <= result.total_time_s
    path, body, headers = http_server.requests[0]
    assert path == "/v2/models/ensemble/generate_stream"
    assert body == {"text_input": "Hi", "stream": True, "num_draft_tokens": 4}
    assert headers["Accept"] == "text/event-stream"


def test_http_stream_error_event_raises(http_server: HttpStandIn) -> None:
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(
        events=[_event({"text_output": "ok"}), _event({"error": "CUDA out of memory"})])
    stream = generate_stream(http_server.url, "Hi")
    assert next(stream) == "ok"
    with pytest.raises(ServerError, match="CUDA out of memory"):
        next(stream)
    assert stream.result is None
    with pytest.raises(StopIteration):
        next(stream)


def test_http_stream_rejected_request_raises_with_status(http_server: HttpStandIn) -> None:
    with pytest.raises(ServerError) as e:
        generate_stream(http_server.url, "Hi", model="missing")
    assert e.value.status == 404 and e.value.message == "no such model"


def _keep_talking(handler: BaseHTTPRequestHandler) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        handler.write_chunk(_event({"text_output": "."}))  # type: ignore[attr-defined]
        time.sleep(0.02)


def test_http_stream_cancel_closes_connection(http_server: HttpStandIn) -> None:
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(
        events=[_event({"text_output": "first", "num_output_tokens": 1})], then=_keep_talking)
    with generate_stream(http_server.url, "Hi") as stream:
        assert next(stream) == "first"
        stream.cancel()
        assert list(stream) == []
    assert stream.result is not None
    assert stream.result.finish_reason == "cancelled" and stream.result.text == "first"
    assert stream.result.num_output_tokens == 1
    assert http_server.disconnected.wait(5)


def test_http_stream_cancel_from_another_thread_unblocks_reader(http_server: HttpStandIn) -> None:
    release = threading.Event()
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(
        events=[_event({"text_output": "first"})], then=lambda h: release.wait(10))
    stream = generate_stream(http_server.url, "Hi")
    assert next(stream) == "first"
    timer = threading.Timer(0.2, stream.cancel)
    timer.start()
    start = time.monotonic()
    try:
        assert list(stream) == []
    finally:
        release.set()
        timer.join()
    assert time.monotonic() - start < 5
    assert stream.result is not None and stream.result.finish_reason == "cancelled"


# ---------------------------------------------------------------- gRPC stand-in

@dataclass
class GrpcStandIn:
    url: str
    script: list[Callable[[service_pb2.ModelInferRequest, Any],
                          Iterator[service_pb2.ModelStreamInferResponse]]]
    requests: list[service_pb2.ModelInferRequest]
    cancelled: threading.Event
    """Set by scripts when the RPC ends before they finish."""


@pytest.fixture
def grpc_server() -> Iterator[GrpcStandIn]:
    requests: list[service_pb2.ModelInferRequest] = []
    cancelled = threading.Event()
    script: list[Any] = []

    class Servicer(service_pb2_grpc.GRPCInferenceServiceServicer):
        def ModelStreamInfer(self, request_iterator: Any, context: Any) -> Any:
            for request in request_iterator:
                requests.append(request)
                yield from script[0](request, context)

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield GrpcStandIn(f"127.0.0.1:{port}", script, requests, cancelled)
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
    assert _request_inputs(request) == {
        "text_input": ("BYTES", [1], [b"Hi"]), "stream": ("BOOL", [1], [True]),
        "max_tokens": ("INT32", [1], [16]),
        "temperature": ("FP32", [1], [pytest.approx(0.7)]),
        "top_p": ("FP32", [1], [pytest.approx(0.9)]), "top_k": ("INT32", [1], [40]),
        "seed": ("UINT64", [1], [2**63 + 5]), "num_draft_tokens": ("INT32", [1], [4]),
        "stop_words": ("BYTES", [2], [b"\n\n", b"END"]),
    }


def test_grpc_generate_sends_stream_false(grpc_server: GrpcStandIn) -> None:
    grpc_server.script.append(lambda req, ctx: iter([_stream_reply(
        b"whole text", {"num_output_tokens": 2, "finish_reason": "eos"}, final=True)]))
    result = grpc_generate(grpc_server.url, "Hi", model="other")
    assert result.text == "whole text" and result.finish_reason == "eos"
    assert result.time_to_first_token_s is None
    request = grpc_server.requests[0]
    assert request.model_name == "other"
    assert _request_inputs(request)["stream"] == ("BOOL", [1], [False])


def test_grpc_error_response_raises(grpc_server: GrpcStandIn) -> None:
    grpc_server.script.append(lambda req, ctx: iter([
        _stream_reply(b"ok"),
        service_pb2.ModelStreamInferResponse(error_message="draft model failed")]))
    stream = grpc_stream(grpc_server.url, "Hi")
    assert next(stream) == "ok"
    with pytest.raises(ServerError, match="draft model failed"):
        next(stream)


def test_grpc_cancel_stops_the_stream_with_cancel_requests(
        grpc_server: GrpcStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    from tritonclient.grpc import InferenceServerClient

    calls: list[bool] = []
    original = InferenceServerClient.stop_stream

    def spy(self: Any, cancel_requests: bool = False) -> None:
        calls.append(cancel_requests)
        original(self, cancel_requests=cancel_requests)

    monkeypatch.setattr(InferenceServerClient, "stop_stream", spy)

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
    assert calls and calls[0] is True
    assert stream.result is not None and stream.result.finish_reason == "cancelled"
    assert stream.result.text == "first" and stream.result.num_output_tokens == 1
    assert grpc_server.cancelled.wait(5)


def test_grpc_unreachable_server_raises_server_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError) as e:
        grpc_generate(f"127.0.0.1:{port}", "Hi", timeout=10)
    assert "UNAVAILABLE" in str(e.value.status)


# ---------------------------------------------------------------- CLI

def test_cli_defaults() -> None:
    args = cli.build_parser().parse_args(["hello"])
    assert (args.prompt, args.url, args.protocol, args.model, args.stream) == \
        ("hello", None, "http", "ensemble", True)
    assert cli.params_from_args(args) == GenerationParams()


def test_cli_all_options() -> None:
    args = cli.build_parser().parse_args([
        "--url", "h:1", "--protocol", "grpc", "--model", "m", "--no-stream", "--max-tokens", "16",
        "--temperature", "0.7", "--top-p", "0.9", "--top-k", "40", "--seed", "3",
        "--num-draft-tokens", "0", "--stop-word", "A", "--stop-word", "B", "-"])
    assert (args.prompt, args.url, args.protocol, args.model, args.stream) == \
        ("-", "h:1", "grpc", "m", False)
    assert cli.params_from_args(args) == GenerationParams(
        max_tokens=16, temperature=0.7, top_p=0.9, top_k=40, seed=3, num_draft_tokens=0,
        stop_words=["A", "B"])


@pytest.mark.parametrize("argv", [["--protocol", "udp", "x"], ["--top-p", "2", "x"],
                                  ["--max-tokens", "many", "x"], []])
def test_cli_bad_usage_exits_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 2
    assert "usage:" in capsys.readouterr().err


@pytest.mark.parametrize("protocol, opener, url", [
    ("http", "generate", "localhost:8000"), ("grpc", "grpc_generate", "localhost:8001")])
def test_cli_default_url_follows_protocol(protocol: str, opener: str, url: str,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[str] = []

    def fake(u: str, prompt: str, params: GenerationParams, **kw: Any) -> Result:
        seen.append(u)
        return Result(text=prompt.upper())

    monkeypatch.setattr(cli, opener, fake)
    assert cli.main(["--protocol", protocol, "--no-stream", "abc"]) == 0
    assert seen == [url]
    assert capsys.readouterr().out == "ABC\n"


def test_cli_streams_text_and_prints_stats(http_server: HttpStandIn,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(events=STREAM_EVENTS)
    rc = cli.main(["--url", http_server.url, "--stop-word", "END", "--seed", "9", "Hi"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out == "Hello\n"
    for part in ("tokens: 3", "draft tokens: 8", "accepted: 6", "acceptance rate: 0.750",
                 "finish reason: length", "time to first token: ", "tokens/s: "):
        assert part in err
    assert http_server.requests[0][1] == {"text_input": "Hi", "stream": True, "seed": 9,
                                          "stop_words": ["END"]}


def test_cli_reads_prompt_from_stdin(http_server: HttpStandIn, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    http_server.replies["/v2/models/ensemble/generate"] = Reply(json_body={"text_output": "ok"})
    monkeypatch.setattr(sys, "stdin", io.StringIO("from stdin\n"))
    assert cli.main(["--url", http_server.url, "--no-stream", "-"]) == 0
    out, err = capsys.readouterr()
    assert out == "ok\n"
    assert "time to first token: n/a" in err and "tokens: n/a" in err
    assert http_server.requests[0][1]["text_input"] == "from stdin\n"


def test_cli_server_error_exits_nonzero(http_server: HttpStandIn,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(
        events=[_event({"error": "prompt too long"})])
    assert cli.main(["--url", http_server.url, "Hi"]) == 1
    assert "prompt too long" in capsys.readouterr().err


def test_cli_connection_refused_exits_nonzero(capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert cli.main(["--url", f"127.0.0.1:{port}", "Hi"]) == 1
    assert "error:" in capsys.readouterr().err
