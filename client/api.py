"""Client API for the speculative-decoding ensemble served by Triton.

The entry points are here; the parameters, results, errors and wire format in wire.py (their
names importable from here too, as users import them), the collection of responses and the
stream in stream.py. The transports load only when used: HTTP over httpx2 (http_transport.py,
the HTTP stack the OpenAI gateway's dependencies bring), gRPC over tritonclient
(grpc_transport.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .wire import (  # noqa: F401  (re-exported: users import them from here)
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    DEFAULT_TIMEOUT_S,
    ENSEMBLE,
    FINISH_CANCELLED,
    FINISH_REASON,
    INPUT_DATATYPES,
    OUTPUTS,
    PROPOSERS,
    RETRYABLE_STATUSES,
    GenerationParams,
    Result,
    ServerError,
    build_generate_body,
    decode_event,
    outputs_from_json,
)

if TYPE_CHECKING:
    from .stream import TextStream


def generate(url: str, prompt: str, params: GenerationParams | None = None, *,
             model: str = ENSEMBLE, timeout: float | None = DEFAULT_TIMEOUT_S) -> Result:
    """Generate without streaming over HTTP ``/v2/models/{model}/generate``.

    ``timeout`` bounds each socket operation in seconds.
    """
    from .http_transport import generate as http_generate

    return http_generate(url, prompt, params, model, timeout)


def generate_stream(url: str, prompt: str, params: GenerationParams | None = None, *,
                    model: str = ENSEMBLE,
                    timeout: float | None = DEFAULT_TIMEOUT_S) -> TextStream:
    """Stream a generation over HTTP ``/v2/models/{model}/generate_stream`` (SSE).

    Cancelling closes the connection, which is how Triton learns to stop.
    ``timeout`` bounds the wait for each piece in seconds.
    """
    from .http_transport import open_stream

    return open_stream(url, prompt, params, model, timeout)


def grpc_stream(url: str, prompt: str, params: GenerationParams | None = None, *,
                model: str = ENSEMBLE,
                timeout: float | None = DEFAULT_TIMEOUT_S) -> TextStream:
    """Stream a generation over gRPC (``stream=True``).

    Cancelling calls ``stop_stream(cancel_requests=True)``. ``timeout`` bounds
    the wait for each response in seconds.
    """
    from .grpc_transport import open_stream

    return open_stream(url, prompt, params, model, timeout, stream=True)


def grpc_generate(url: str, prompt: str, params: GenerationParams | None = None, *,
                  model: str = ENSEMBLE, timeout: float | None = DEFAULT_TIMEOUT_S) -> Result:
    """Generate without streaming over gRPC (``stream=False``).

    It still uses the streaming RPC because a decoupled model answers only there.
    """
    from .grpc_transport import open_stream

    return open_stream(url, prompt, params, model, timeout, stream=False).wait()
