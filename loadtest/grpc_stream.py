"""gRPC streaming for the load test, straight on tritonclient.grpc.

One InferenceServerClient (one channel) per locust user, one bidirectional stream per request,
as a real streaming client keeps its connection. A stream ends cleanly (the final response, then
a half-close) unless the plan cancels it or it times out; status codes are asked only of a
server without Triton's triton_grpc_error crash (specdec_client.grpc_transport). Input tensors
take the rank the server's model metadata declares ([1, 1] for the ensemble's batch dimension,
[1] for a model without one), so the load test follows the model repository's configuration
instead of assuming one. Responses are collected with specdec_client's Collector, so the
timings mean exactly what they mean for the HTTP users (seconds since the request was sent, one
time per non-empty text piece).
"""
from __future__ import annotations

import codecs
import queue
import uuid
from typing import Any

import gevent
from tritonclient.grpc import InferenceServerClient
from tritonclient.utils import InferenceServerException

from specdec_client import ENSEMBLE, GenerationParams, Result, ServerError
from specdec_client.stream import Collector
from specdec_client.grpc_transport import (CANCEL_SAFE_SINCE, CLOSE_GRACE_S,
                                           build_infer_inputs, close_stream, input_ranks,
                                           outputs_from_infer_result, server_version,
                                           stream_headers)

_TRITON_FINAL = "triton_final_response"


class GrpcStreamer:
    """Sends streamed generations on one gRPC channel, one request at a time."""

    def __init__(self, address: str, model: str = ENSEMBLE) -> None:
        self.address = address
        self.model = model
        self.client = InferenceServerClient(address)
        self._ranks: dict[str, int] | None = None
        self._headers: dict[str, str] | None = None
        self._version: tuple[int, ...] = (0,)

    def ranks(self) -> dict[str, int]:
        """Each input's rank from the model metadata, and the stream headers for the server's
        version (fetched once)."""
        if self._ranks is None:
            try:
                self._version = server_version(self.client, self.address)
                self._headers = stream_headers(self._version)
                self._ranks = input_ranks(self.client, self.address, self.model)
            except InferenceServerException as e:
                raise ServerError(e.message(), e.status()) from e
        return self._ranks

    def cancel_is_safe(self) -> bool:
        """Whether a cancellation over gRPC cannot crash this server (CANCEL_SAFE_SINCE)."""
        self.ranks()
        return self._version >= CANCEL_SAFE_SINCE

    def inputs(self, prompt: str, params: GenerationParams) -> list[Any]:
        return build_infer_inputs(prompt, params, True, self.ranks())

    def generate(self, prompt: str, params: GenerationParams, timeout: float,
                 cancel_after: int = 0) -> Result:
        """Stream one generation to its end, or cancel it after `cancel_after` text pieces;
        raises ServerError / TimeoutError on failure."""
        inputs = self.inputs(prompt, params)
        collector = Collector()
        responses: queue.Queue[tuple[Any, Any]] = queue.Queue()
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        cancel = True   # until the request ends or fails on its own
        try:
            # Inside the try: a stop that lands while the stream starts still closes it.
            self.client.start_stream(
                callback=lambda result, error: responses.put((result, error)),
                headers=self._headers)
            self.client.async_stream_infer(self.model, inputs, request_id=uuid.uuid4().hex,
                                           enable_empty_final_response=True)
            while True:
                try:
                    result, error = responses.get(timeout=timeout)
                except queue.Empty:
                    raise TimeoutError(f"no response within {timeout} s") from None
                if error is not None:
                    cancel = False   # an error is its request's last response
                    raise ServerError(error.message(), error.status())
                parameters = result.get_response().parameters
                final = _TRITON_FINAL in parameters and parameters[_TRITON_FINAL].bool_param
                if collector.add(outputs_from_infer_result(result, decoder, final)) and \
                        cancel_after and len(collector.pieces) >= cancel_after and not final:
                    return collector.result(streamed=True, cancelled=True)   # finally cancels
                if final:
                    cancel = False
                    return collector.result(streamed=True)
        except InferenceServerException as e:
            raise ServerError(e.message(), e.status()) from e
        except gevent.GreenletExit:
            # locust stops this user mid-stream: let the request finish (close_stream's grace)
            # rather than cut it; the load test ends within that bound.
            cancel = False
            raise
        finally:
            # Cut only what the plan cancels, a stream that timed out or broke.
            try:
                close_stream(self.client, cancel, grace_s=min(timeout, CLOSE_GRACE_S))
            except Exception:
                pass

    def close(self) -> None:
        try:
            self.client.close()
        except Exception:
            pass
