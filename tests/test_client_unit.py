"""Unit tests of specdec_client that need no Triton server: parameters, parsing, the CLI, and
HTTP against a tiny stand-in server on 127.0.0.1, so framing, encoding and cancellation go over a
real socket (gRPC: test_client_grpc_unit.py)."""

from __future__ import annotations

import io
import json
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specdec_client import (
    GenerationParams,
    Result,
    ServerError,
    generate,
    generate_stream,
)
from specdec_client import api, cli

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


# ---------------------------------------------------------------- parsing

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


def test_http_stream_reads_sse_framing(http_server: HttpStandIn) -> None:
    """Comments, other fields, CRLF line ends and data split over lines are SSE, not text."""
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(events=[
        ": keep-alive\r\n\r\n", "event: message\nid: 7\nretry: 10\n",
        'data: {"text_output":\r\ndata:  "a"}\r\n\r\n', _event({"text_output": "b"})])
    assert list(generate_stream(http_server.url, "Hi")) == ["a", "b"]


def test_http_transport_failures_keep_standard_types() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError):
        generate(f"127.0.0.1:{port}", "Hi")
    with pytest.raises(ConnectionError):
        generate_stream(f"127.0.0.1:{port}", "Hi")
    with pytest.raises(ValueError, match="not an HTTP URL"):
        generate("ftp://127.0.0.1:1", "Hi")


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


def test_http_stream_that_goes_silent_times_out(http_server: HttpStandIn) -> None:
    release = threading.Event()
    http_server.replies["/v2/models/ensemble/generate_stream"] = Reply(
        events=[_event({"text_output": "first"})], then=lambda h: release.wait(10))
    stream = generate_stream(http_server.url, "Hi", timeout=0.5)
    try:
        assert next(stream) == "first"
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            next(stream)
        assert time.monotonic() - start < 5
    finally:
        release.set()
