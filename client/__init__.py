"""Client for the speculative-decoding LLM server on Triton (HTTP and gRPC)."""

from .api import generate, generate_stream, grpc_generate, grpc_stream
from .stream import TextStream
from .wire import (
    DEFAULT_GRPC_URL,
    DEFAULT_HTTP_URL,
    ENSEMBLE,
    GenerationParams,
    Result,
    ServerError,
)

__all__ = [
    "DEFAULT_GRPC_URL",
    "DEFAULT_HTTP_URL",
    "ENSEMBLE",
    "GenerationParams",
    "Result",
    "ServerError",
    "TextStream",
    "generate",
    "generate_stream",
    "grpc_generate",
    "grpc_stream",
]
