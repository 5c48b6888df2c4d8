"""gRPC transport: one request per tritonclient bidirectional stream.

Separate from api.py so that tritonclient.grpc, grpcio and numpy load only when
gRPC is used.
"""

from __future__ import annotations

import codecs
import queue
import threading
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import numpy as np
from tritonclient.grpc import InferenceServerClient, InferInput
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from .wire import (
    FINISH_REASON,
    INPUT_DATATYPES,
    OUTPUTS,
    STOP_WORDS,
    STREAM,
    TEXT_INPUT,
    TEXT_OUTPUT,
    GenerationParams,
    ServerError,
)
from .stream import Collector, TextStream

_TRITON_FINAL = "triton_final_response"
# Asks Triton to end the stream with the error's own gRPC status code (UNAVAILABLE,
# INVALID_ARGUMENT...) instead of a message without one. Before Triton 2.68 (NGC 26.04) that
# mode has a use-after-free that can take the server down when a stream closes (server pull
# request 8708; docs/reliability.md), so it is asked of a fixed server only; elsewhere a
# retryable error is told by the UNAVAILABLE: marker in its message (ServerError.retryable).
STATUS_HEADERS = {"triton_grpc_error": "true"}
STATUS_HEADERS_SINCE = (2, 68)
# A gRPC cancellation can race the response in flight and crash Triton before 2.57 (server pull
# requests 7840, in 2.53, and 8078): tools that cancel on their own initiative (the load test)
# cancel over gRPC only from this version on. A caller's own cancel() is always honoured.
CANCEL_SAFE_SINCE = (2, 57)
# What a server says of itself (its version, a model's input ranks) is remembered per address
# for a minute: a fact per stream would cost a round trip per request.
_FACTS_TTL_S = 60.0
_facts: dict[tuple, tuple[float, Any]] = {}
_facts_lock = threading.Lock()
# How long a clean close waits for the server to end a stream whose request is still running
# (it ends at once when none is) before cutting it.
CLOSE_GRACE_S = 10.0


def parse_version(text: str) -> tuple[int, ...]:
    """'2.51.0' -> (2, 51, 0); anything unreadable is (0,): treated as the oldest server."""
    try:
        return tuple(int(p) for p in text.split("-")[0].split("."))
    except ValueError:
        return (0,)


def _remembered(key: tuple, fetch: Any) -> Any:
    now = time.monotonic()
    with _facts_lock:
        seen = _facts.get(key)
    if seen is not None and now - seen[0] < _FACTS_TTL_S:
        return seen[1]
    value = fetch()
    with _facts_lock:
        _facts[key] = (now, value)
    return value


def server_version(client: Any, url: str, timeout: float | None = None) -> tuple[int, ...]:
    """The server's version from its metadata."""
    return _remembered(("version", url), lambda: parse_version(
        client.get_server_metadata(client_timeout=timeout).version))


def input_ranks(client: Any, url: str, model: str,
                timeout: float | None = None) -> dict[str, int]:
    """Each input's rank from the model's metadata: 2 for the ensemble's [1, 1] (a batch
    dimension first, as TensorRT-LLM's), 1 for a model without a batch dimension."""
    def fetch() -> dict[str, int]:
        meta = client.get_model_metadata(model, client_timeout=timeout)
        return {i.name: len(i.shape) for i in meta.inputs}
    return _remembered(("ranks", url, model), fetch)


def stream_headers(version: tuple[int, ...]) -> dict[str, str] | None:
    """The headers to open a stream with on a server of this version."""
    return STATUS_HEADERS if version >= STATUS_HEADERS_SINCE else None


def close_stream(client: Any, cancel: bool = False, grace_s: float = CLOSE_GRACE_S) -> bool:
    """End `client`'s stream; True when it ended cleanly.

    cancel: cut it now (the server cancels what is in flight). Otherwise half-close and let the
    server end the stream, which it does as soon as no request on it is running: at once after
    a final response or an error. A request still running after `grace_s` is cut, so a close
    never hangs on a server that does not answer.
    """
    if cancel:
        client.stop_stream(cancel_requests=True)
        return False

    def half_close() -> None:
        try:
            client.stop_stream(cancel_requests=False)
        except Exception:   # a stream that already broke: nothing left to close
            pass
    closer = threading.Thread(target=half_close, daemon=True)
    closer.start()
    closer.join(grace_s)
    if not closer.is_alive():
        return True
    try:
        client.stop_stream(cancel_requests=True)
    except AttributeError:   # the half-close finished between the join and the cut
        pass
    closer.join()
    return False


def build_infer_inputs(prompt: str, params: GenerationParams | None = None,
                       stream: bool = True, ranks: dict[str, int] | None = None) -> list[Any]:
    """tritonclient.grpc InferInputs: one element each (stop_words: one per word), shaped to the
    rank the model declares (`ranks`, from input_ranks; absent: 1): [1, 1] and [1, N] for the
    ensemble, whose batch dimension comes first as in TensorRT-LLM's."""
    values: dict[str, Any] = {TEXT_INPUT: [prompt.encode("utf-8")], STREAM: [stream]}
    for name, value in (params or GenerationParams()).fields().items():
        if name == STOP_WORDS:
            values[name] = [w.encode("utf-8") for w in value]
        else:
            values[name] = [value.encode("utf-8") if isinstance(value, str) else value]
    return infer_inputs(values, INPUT_DATATYPES, ranks)


def infer_inputs(rows: dict[str, list[Any]], datatypes: dict[str, str],
                 ranks: dict[str, int] | None = None) -> list[Any]:
    """A tritonclient.grpc InferInput per name, holding its row (strings already bytes) as
    `datatypes` names it, shaped to the rank the model declares (absent: 1)."""
    inputs = []
    for name, row in rows.items():
        datatype = datatypes[name]
        array = np.array(row, dtype=triton_to_np_dtype(datatype))
        array = array.reshape((1,) * ((ranks or {}).get(name, 1) - 1) + (len(row),))
        tensor = InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _as_bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def outputs_from_infer_result(result: Any, decoder: codecs.IncrementalDecoder | None = None,
                              final: bool = False) -> dict[str, Any]:
    """Known outputs of one tritonclient InferResult.

    An incremental decoder keeps a UTF-8 character split across two streamed
    pieces intact.
    """
    decoder = decoder or codecs.getincrementaldecoder("utf-8")("replace")
    out: dict[str, Any] = {}
    for name in OUTPUTS:
        array = result.as_numpy(name)
        if array is None or array.size == 0:
            continue
        flat = array.reshape(-1)
        if name == TEXT_OUTPUT:
            out[name] = decoder.decode(b"".join(_as_bytes(v) for v in flat), final)
        elif name == FINISH_REASON:
            out[name] = _as_bytes(flat[0]).decode("utf-8", "replace")
        else:
            out[name] = flat[0].item()
    return out


def _grpc_address(url: str) -> str:
    return urlsplit(url).netloc if "://" in url else url


class _GrpcStream(TextStream):
    """One request on a tritonclient gRPC bidirectional stream.

    Responses arrive on tritonclient's thread and are handed over through a
    queue; the empty final response (``triton_final_response``) ends it.
    """

    def __init__(self, client: Any, model: str, inputs: list[Any], timeout: float | None,
                 streamed: bool, collector: Collector, headers: dict[str, str] | None) -> None:
        super().__init__(collector, streamed)
        self._client = client
        self._timeout = timeout
        self._queue: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._final = False
        self._closed = False
        client.start_stream(callback=self._on_response, headers=headers)
        try:
            client.async_stream_infer(model, inputs, request_id=uuid.uuid4().hex,
                                      enable_empty_final_response=True)
        except Exception:
            cause = self._reported_error()
            if cause is not None:
                raise cause from None
            raise

    def _reported_error(self) -> Any:
        """The error that broke the stream before the request was sent.

        tritonclient hands the cause (e.g. UNAVAILABLE) only to the callback;
        its own exception merely says the stream is no longer valid.
        """
        try:
            return self._queue.get(timeout=1.0)[1]
        except queue.Empty:
            return None

    def _on_response(self, result: Any, error: Any) -> None:
        self._queue.put((result, error))

    def _receive(self) -> dict[str, Any] | None:
        if self._final:
            return None
        try:
            result, error = self._queue.get(timeout=self._timeout)
        except queue.Empty:
            raise TimeoutError(f"no response from the server within {self._timeout} s") from None
        if result is None and error is None:
            return None
        if error is not None:
            raise ServerError(error.message(), error.status())
        params = result.get_response().parameters
        self._final = _TRITON_FINAL in params and params[_TRITON_FINAL].bool_param
        return outputs_from_infer_result(result, self._decoder, self._final)

    def _close(self, cancel: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                close_stream(self._client, cancel)
            finally:
                self._client.close()

    def _abort(self) -> None:
        """Cancel, then wake a reader that may be waiting in another thread."""
        self._close(cancel=True)
        self._queue.put((None, None))

    def _release(self) -> None:
        self._close(cancel=False)

    def _fail(self, error: BaseException) -> None:
        # An error the server sent ends its request: close cleanly. A timeout or a broken
        # stream leaves nothing to wait for: cut it.
        if isinstance(error, ServerError):
            self._release()
        else:
            self._abort()


def open_stream(url: str, prompt: str, params: GenerationParams | None, model: str,
                timeout: float | None, stream: bool) -> TextStream:
    """Send one request on a new gRPC stream; ``stream`` is the model's input."""
    collector = Collector()
    address = _grpc_address(url)
    client = InferenceServerClient(address)
    try:
        headers = stream_headers(server_version(client, address, timeout))
        inputs = build_infer_inputs(prompt, params, stream,
                                    input_ranks(client, address, model, timeout))
        return _GrpcStream(client, model, inputs, timeout, stream, collector, headers)
    except InferenceServerException as e:
        client.close()
        raise ServerError(e.message(), e.status()) from e
    except BaseException:
        client.close()
        raise
