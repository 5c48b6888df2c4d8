"""The client's parameters, results, errors and wire format: what api.py's entry points and
the transports (http_transport.py, grpc_transport.py, stream.py) share. Below all of them: it
imports none."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


# The tensor names shared with the server (specdec.names imports nothing: no torch here).
from specdec.names import (  # noqa: F401  (FINISH_REASON re-exported)
    ENSEMBLE,
    FINISH_REASON,
    MAX_TOKENS,
    NUM_DRAFT_TOKENS,
    PROPOSER,
    SEED,
    STATS_OUTPUTS,
    STOP_WORDS,
    STREAM,
    TEMPERATURE,
    TEXT_INPUT,
    TEXT_OUTPUT,
    TOP_K,
    TOP_P,
    UNAVAILABLE,
)

OUTPUTS = (TEXT_OUTPUT,) + STATS_OUTPUTS

INPUT_DATATYPES: dict[str, str] = {
    TEXT_INPUT: "BYTES",
    STREAM: "BOOL",
    MAX_TOKENS: "INT32",
    TEMPERATURE: "FP32",
    TOP_P: "FP32",
    TOP_K: "INT32",
    SEED: "UINT64",
    NUM_DRAFT_TOKENS: "INT32",
    STOP_WORDS: "BYTES",
    PROPOSER: "BYTES",
}
PROPOSERS = ("draft", "ngram", "suffix", "eagle", "self", "medusa", "hybrid")

FINISH_CANCELLED = "cancelled"
DEFAULT_HTTP_URL = "localhost:8000"
DEFAULT_GRPC_URL = "localhost:8001"
DEFAULT_TIMEOUT_S = 600.0


# Statuses that mean "try again, here later or elsewhere", never "fix the request".
RETRYABLE_STATUSES = (429, 503, "StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED")


class ServerError(Exception):
    """An error reported by the server.

    ``status`` is the HTTP status code, the gRPC status (e.g.
    ``"StatusCode.UNAVAILABLE"``), or None when the error arrived inside an
    otherwise successful stream.
    """

    def __init__(self, message: str, status: int | str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status

    @property
    def retryable(self) -> bool:
        """Overload or a restarting model: the same request may succeed later. Over HTTP the
        status cannot tell (Triton's generate endpoints answer 400 for every error), so the
        server's UNAVAILABLE marker in the message decides."""
        return self.status in RETRYABLE_STATUSES or UNAVAILABLE in self.message

    def __str__(self) -> str:
        return f"{self.message} (status {self.status})" if self.status is not None else self.message


def _check(value: float | None, name: str, lo: float, hi: float | None = None,
           integer: bool = False) -> None:
    if value is None:
        return
    if integer and (isinstance(value, bool) or not isinstance(value, int)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if not (value >= lo and (hi is None or value <= hi)):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ValueError(f"{name} must be {bound}, got {value!r}")


@dataclass
class GenerationParams:
    """Sampling and speculation settings of one request.

    Field names are the ensemble's input names. ``None`` leaves the input out
    of the request so the server's default applies; an empty ``stop_words``
    is treated the same way because a zero-width tensor is not a valid input.
    ``num_draft_tokens=0`` asks for plain target decoding; ``None`` (or -1) lets
    the server choose the draft length per round. ``proposer`` drafts with the
    draft model, prompt lookup (``ngram``), the server's EAGLE-3 head (``eagle``),
    the target with layers skipped (``self``), Medusa heads (``medusa``), or any of
    those it has, per round (``hybrid``).
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    num_draft_tokens: int | None = None
    stop_words: Sequence[str] | None = None
    proposer: str | None = None

    def __post_init__(self) -> None:
        _check(self.max_tokens, MAX_TOKENS, 1, integer=True)
        _check(self.temperature, TEMPERATURE, 0.0)
        _check(self.top_p, TOP_P, 0.0, 1.0)
        _check(self.top_k, TOP_K, 0, integer=True)
        _check(self.seed, SEED, 0, 2**64 - 1, integer=True)
        _check(self.num_draft_tokens, NUM_DRAFT_TOKENS, -1, integer=True)
        if self.stop_words is not None:
            if isinstance(self.stop_words, (str, bytes)):
                raise TypeError("stop_words must be a sequence of strings, not one string")
            if not all(isinstance(w, str) for w in self.stop_words):
                raise TypeError("stop_words must contain only strings")
        if self.proposer is not None and self.proposer not in PROPOSERS:
            raise ValueError(f"proposer must be one of {', '.join(PROPOSERS)}, "
                             f"got {self.proposer!r}")

    def fields(self) -> dict[str, Any]:
        """The inputs to send, by name, leaving out those at server default."""
        out: dict[str, Any] = {}
        for name in (MAX_TOKENS, TEMPERATURE, TOP_P, TOP_K, SEED, NUM_DRAFT_TOKENS, PROPOSER):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.stop_words:
            out[STOP_WORDS] = list(self.stop_words)
        return out


@dataclass
class Result:
    """The outcome of one generation with its server statistics and timings.

    Statistics the server did not send are None. Times are seconds since the
    request was sent; ``time_to_first_token_s`` is None when the response was
    not streamed, since a single response cannot tell it apart from the total.
    """

    text: str
    num_output_tokens: int | None = None
    num_input_tokens: int | None = None          # prompt tokens
    total_draft_tokens: int | None = None
    total_accepted_draft_tokens: int | None = None
    acceptance_rate: float | None = None
    finish_reason: str | None = None
    ngram_draft_tokens: int | None = None        # of total_draft_tokens, prompt lookup's
    ngram_accepted_tokens: int | None = None
    time_to_first_token_s: float | None = None
    total_time_s: float = 0.0
    chunk_times_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float | None:
        """Output tokens over the whole request time."""
        if not self.num_output_tokens or self.total_time_s <= 0:
            return None
        return self.num_output_tokens / self.total_time_s

    @property
    def inter_chunk_latencies_s(self) -> list[float]:
        """Gaps between consecutive text pieces, for inter-token latency."""
        t = self.chunk_times_s
        return [b - a for a, b in zip(t, t[1:])]


def build_generate_body(prompt: str, params: GenerationParams | None = None,
                        stream: bool = False) -> dict[str, Any]:
    """The JSON body for Triton's generate / generate_stream endpoints."""
    body: dict[str, Any] = {TEXT_INPUT: prompt, STREAM: stream}
    body.update((params or GenerationParams()).fields())
    return body


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def outputs_from_json(obj: dict[str, Any]) -> dict[str, Any]:
    """Known outputs of one generate response, whether scalars or nested lists."""
    out: dict[str, Any] = {}
    for name in OUTPUTS:
        if name not in obj:
            continue
        leaves = _leaves(obj[name])
        if name == TEXT_OUTPUT:
            out[name] = "".join(str(v) for v in leaves)
        elif leaves:
            out[name] = leaves[0]
    return out


def decode_event(data: str | bytes) -> dict[str, Any]:
    """Parse one JSON response or SSE event, raising ServerError for an error."""
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise ServerError(f"malformed response from server: {data!r:.200}") from e
    if not isinstance(obj, dict):
        raise ServerError(f"malformed response from server: {data!r:.200}")
    if "error" in obj:
        raise ServerError(str(obj["error"]))
    return obj
