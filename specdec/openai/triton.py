"""The speculative_decoding model over gRPC streaming, with tritonclient's asyncio client: one
stream a request, token ids in and out.

The gateway calls the orchestrator itself, not the ensemble around it: a client that leaves
cancels the orchestrator's own request, which Triton passes to the running model directly (the
ensemble's clients are stopped one step later, through postprocessing), and a response takes one
hop instead of the ensemble's two steps. The gateway therefore does what the ensemble's
preprocessing and postprocessing do, with the same functions and the target's tokenizer: the
prompt and the stop words to ids, each response's ids to its piece of text.

The request iterator yields the one request and ends, which half-closes the stream: the server
ends it as soon as the request is done, so a finished or failed request closes cleanly. Only a
consumer that stops early (its HTTP client went away) cancels the stream; the orchestrator sees
the cancellation between rounds and frees the sequence's slots. Status codes (triton_grpc_error)
are asked only of a server that reports Triton 2.68 or later (docs/reliability.md); elsewhere
errors arrive as messages and `api_error` reads them.
"""
from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from specdec import names
from specdec.serving.detokenize import fallback_bytes, piece
from specdec.serving.requests import InvalidInput
from specdec.serving.settings import RequestLimits
from specdec.serving.tokenizer import decode_ids, encode_request
from specdec_client import GenerationParams
from specdec_client.wire import INPUT_DATATYPES
from specdec_client.grpc_transport import (infer_inputs, outputs_from_infer_result,
                                           parse_version, stream_headers)
from specdec_client.stream import Collector

from . import logprobs
from .protocol import ApiError, Generation

FACTS_TTL_S = 60.0
RETRY_AFTER_S = "1"
# The orchestrator's input names in the OpenAI body's words, for errors that name one.
PARAMS = {names.TEMPERATURE: "temperature", names.TOP_P: "top_p", names.TOP_K: "top_k",
          names.SEED: "seed", names.NUM_DRAFT_TOKENS: "num_draft_tokens",
          names.STOP_WORDS: "stop", names.PROPOSER: "proposer",
          names.JSON_SCHEMA: "response_format"}
# The orchestrator's inputs: the token ids preprocessing makes, and the ensemble's others.
DATATYPES = {**INPUT_DATATYPES, names.INPUT_IDS: "INT32", names.STOP_IDS: "INT32",
             names.STOP_LENGTHS: "INT32", names.TOP_LOGPROBS: "INT32",
             names.PROMPT_LOGPROBS: "INT32", names.JSON_SCHEMA: "BYTES",
             names.TENANT: "BYTES"}
# What a response's outputs hold besides the orchestrator's own: its new tokens' logprobs and
# the prompt's (logprobs.Scored lists), where the request asked.
SCORED, PROMPT_SCORED = "scored", "prompt_scored"
# "field: reason", as the orchestrator refuses a request (prefixed "in ensemble 'x', " by a
# Triton ensemble).
_REFUSAL = re.compile(r"(?:in ensemble '[^']*', )?(\w+): (.*)", re.S)


class TritonError(Exception):
    def __init__(self, message: str, status: str | None = None):
        super().__init__(message)
        self.message, self.status = message, status


class SpecDecoding:
    """The gateway's client of one speculative_decoding model."""

    def __init__(self, url: str, tokenizer, model: str = names.ORCHESTRATOR,
                 limits: RequestLimits = RequestLimits()):
        self.url, self.tokenizer, self.model, self.limits = url, tokenizer, model, limits
        self.byte_of = fallback_bytes(tokenizer.get_vocab())
        self._client = None
        self._facts: tuple[float, dict | None, dict[str, int]] | None = None

    @property
    def client(self):
        """Made on first use, inside the server's event loop (a gRPC aio channel belongs to the
        loop it was made in)."""
        if self._client is None:
            from tritonclient.grpc.aio import InferenceServerClient
            self._client = InferenceServerClient(self.url)
        return self._client

    async def facts(self) -> tuple[dict | None, dict[str, int]]:
        """(stream headers for the server's version, the model's input ranks), a minute old
        at most."""
        now = time.monotonic()
        if self._facts is None or now - self._facts[0] > FACTS_TTL_S:
            from tritonclient.utils import InferenceServerException
            try:
                server = await self.client.get_server_metadata()
                model = await self.client.get_model_metadata(self.model)
            except InferenceServerException as e:
                raise TritonError(e.message(), e.status()) from None
            self._facts = (now, stream_headers(parse_version(server.version)),
                           {i.name: len(i.shape) for i in model.inputs})
        return self._facts[1], self._facts[2]

    async def ready(self) -> bool:
        try:
            return bool(await self.client.is_model_ready(self.model, client_timeout=5))
        except Exception:
            return False

    def inputs(self, prompt: str, params: GenerationParams, stream: bool,
               ranks: dict[str, int], extra: dict[str, int | str] | None = None
               ) -> tuple[list[Any], list[int]]:
        """The request's tensors, as preprocessing would hand them to the orchestrator, and
        the prompt's ids; a request over the limits is refused before the tokenizer runs.
        extra: inputs GenerationParams does not hold (Generation.extra_inputs)."""
        fields = params.fields()
        ids, stop_ids, stop_lengths = encode_request(
            self.tokenizer, prompt, fields.pop(names.STOP_WORDS, []), self.limits)
        rows: dict[str, list] = {names.INPUT_IDS: ids, names.STREAM: [stream]}
        if stop_ids:
            rows[names.STOP_IDS], rows[names.STOP_LENGTHS] = stop_ids, stop_lengths
        for name, value in {**fields, **(extra or {})}.items():
            rows[name] = [value.encode() if isinstance(value, str) else value]
        return infer_inputs(rows, DATATYPES, ranks), ids

    def _decode(self, ids: list[int], keep: frozenset[int] = frozenset()) -> str:
        """keep: special ids shown as text all the same (a tool call's marker, for its parser)."""
        if not keep.intersection(ids):
            return decode_ids(self.tokenizer, ids)
        text, start = [], 0
        for i, token in enumerate(ids):
            if token in keep:
                text += [decode_ids(self.tokenizer, ids[start:i]),
                         self.tokenizer.convert_ids_to_tokens(token)]
                start = i + 1
        return "".join(text) + decode_ids(self.tokenizer, ids[start:])

    async def generate(self, prompt: str, params: GenerationParams, stream: bool,
                       keep: frozenset[int] = frozenset(), extra: dict[str, int | str] | None = None
                       ) -> AsyncIterator[dict[str, Any]]:
        """The outputs of each response, its text included, and its scored tokens where the
        request asked (SCORED, PROMPT_SCORED); TritonError for an error, the server's or the
        connection's (or a request over the limits). Leaving early (an exception or
        cancellation in the consumer) cuts the stream, which ends the generation. keep: see
        _decode; extra: see inputs."""
        import grpc
        decode = self._decode if not keep else lambda ids: self._decode(ids, keep)
        headers, ranks = await self.facts()
        try:
            inputs, prompt_ids = self.inputs(prompt, params, stream, ranks, extra)
        except InvalidInput as e:
            raise TritonError(str(e), "StatusCode.INVALID_ARGUMENT") from None

        async def one_request():
            yield {"model_name": self.model, "inputs": inputs, "request_id": uuid.uuid4().hex}

        responses = self.client.stream_infer(one_request(), headers=headers)
        ended = False
        try:
            while True:
                try:
                    result, error = await responses.__anext__()
                except StopAsyncIteration:
                    ended = True
                    return
                except grpc.RpcError as e:   # the stream's own status (a code, or a broken link)
                    ended = True
                    raise TritonError(e.details() or str(e.code()), str(e.code())) from None
                if error is not None:
                    ended = True   # an error is its request's last response
                    raise TritonError(error.message(), error.status())
                outputs = outputs_from_infer_result(result)
                ids = result.as_numpy(names.OUTPUT_IDS)
                if ids is not None:
                    ids = ids.reshape(-1).tolist()
                    prefix = int(result.as_numpy(names.PREFIX_LENGTH).reshape(-1)[0])
                    outputs[names.TEXT_OUTPUT] = piece(
                        decode, ids, prefix,
                        bool(result.as_numpy(names.IS_FINAL).reshape(-1)[0]), self.byte_of)
                    if extra:
                        outputs[SCORED], outputs[PROMPT_SCORED] = logprobs.of_response(
                            result, ids[prefix:], prompt_ids)
                yield outputs
        finally:
            if not ended:
                responses.cancel()

    async def collect(self, gen: Generation, params: GenerationParams | None = None) -> Collector:
        """One choice's whole answer (params: that choice's, gen.params by default), its scored
        tokens in the collector's `scored` and `prompt_scored`."""
        collector = Collector()
        collector.scored, collector.prompt_scored = [], None
        async for outputs in self.generate(gen.prompt, params or gen.params, False, gen.keep_ids,
                                           gen.extra_inputs()):
            collector.add(outputs)
            collector.scored += outputs.get(SCORED) or []
            collector.prompt_scored = outputs.get(PROMPT_SCORED) or collector.prompt_scored
        return collector


def api_error(e: TritonError, gen: Generation) -> ApiError:
    """The server's error as OpenAI's: 503 to retry (a full server, a model restarting, a
    server not answering), 400 naming the parameter for a refusal, 500 for the server's own."""
    message = e.message
    if names.UNAVAILABLE in message or e.status in ("StatusCode.UNAVAILABLE",
                                                    "StatusCode.RESOURCE_EXHAUSTED"):
        return ApiError(503, f"the server cannot take this request now; retry later ({message})",
                        code="unavailable", headers={"Retry-After": RETRY_AFTER_S})
    refusal = _REFUSAL.match(message)
    if refusal and e.status in (None, "StatusCode.INVALID_ARGUMENT"):
        field, reason = refusal.groups()
        prompt = "messages" if gen.chat else "prompt"
        param = {**PARAMS, names.MAX_TOKENS: gen.max_param, names.TEXT_INPUT: prompt,
                 names.INPUT_IDS: prompt}.get(field)
        if param is not None:
            return ApiError(400, f"{param}: {reason}", param)
    if e.status == "StatusCode.INVALID_ARGUMENT":
        return ApiError(400, message)
    return ApiError(500, f"the server failed: {message}")
