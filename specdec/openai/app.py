"""The routes: /v1/models, /v1/chat/completions, /v1/completions, and the gateway's probes.

A streamed answer's HTTP status is decided before its first byte: the first response from the
server is awaited first, so a refusal or a full server is a 400 or a 503, not an error inside
a 200 stream. A client that goes away cancels its generation: a stream's generator is cancelled
by the server, a non-streamed request is watched for the disconnect while it runs. `n` choices
are n requests to the server at once, each its own sequence there; their chunks interleave as
they come.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import protocol, tools
from .limits import Limits
from .protocol import ApiError, Generation
from .logprobs import TokenText
from .triton import PROMPT_SCORED, SCORED, SpecDecoding, TritonError, api_error

DISCONNECT_POLL_S = 0.25


def create_app(server: SpecDecoding, tokenizer, served: str,
               limits: Limits = Limits()) -> FastAPI:
    app = FastAPI(title="triton-specdec OpenAI-compatible API", docs_url=None, redoc_url=None,
                  openapi_url=None)
    created = int(time.time())
    gateway = replace(limits.gateway,
                      tool_parser=tools.choose(limits.gateway.tool_parser, tokenizer))
    text_of = TokenText(tokenizer)   # a scored token's text, for logprobs

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), e.status, headers=e.headers)

    @app.exception_handler(Exception)
    async def _our_fault(_request: Request, e: Exception) -> JSONResponse:
        return JSONResponse(ApiError(500, f"the gateway failed: {type(e).__name__}: {e}").body(),
                            500)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [_model(served, created)]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        if model != served:
            raise ApiError(404, f"the model '{model:.100}' does not exist", "model",
                           "model_not_found")
        return _model(served, created)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _serve(request, server, protocol.parse_chat(
            await _body(request), served, tokenizer, limits.server, gateway), text_of)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, server, protocol.parse_completion(
            await _body(request), served, limits.server, gateway), text_of)

    @app.get("/health")
    async def health() -> Response:
        """Readiness: the server answers. Liveness is /health/live (this process)."""
        if await server.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "the speculative_decoding model is not ready"}, 503)

    @app.get("/health/live")
    async def live() -> dict:
        return {"status": "live"}

    return app


def _model(served: str, created: int) -> dict:
    return {"id": served, "object": "model", "created": created, "owned_by": "triton-specdec"}


async def _body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        raise ApiError(400, "the request body is not valid JSON") from None


async def _serve(request: Request, server: SpecDecoding, gen: Generation,
                 text_of: TokenText) -> Response:
    rid = protocol.new_id(gen.chat)
    if gen.stream:
        return await _stream(server, gen, rid, text_of)
    tasks = [asyncio.ensure_future(server.collect(gen, p)) for p in gen.choice_params()]
    try:
        while True:   # a client that leaves cancels its generations
            done, pending = await asyncio.wait(tasks, timeout=DISCONNECT_POLL_S,
                                               return_when=asyncio.FIRST_EXCEPTION)
            errors = [t.exception() for t in done if t.exception() is not None]
            if errors:   # one choice failed: the answer is its error, the others stop
                raise errors[0]
            if not pending:
                break
            if await request.is_disconnected():
                return Response(status_code=499)
        collected = [t.result() for t in tasks]
        results = [c.result(streamed=False) for c in collected]
    except TritonError as e:
        raise api_error(e, gen) from None
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
    scored = [(getattr(c, "scored", None), getattr(c, "prompt_scored", None)) for c in collected]
    return JSONResponse(protocol.response(gen, rid, results, text_of, scored))


async def _first(responses: AsyncIterator[dict]) -> dict | None:
    try:
        return await responses.__anext__()
    except StopAsyncIteration:
        return None


async def _stream(server: SpecDecoding, gen: Generation, rid: str,
                  text_of: TokenText) -> Response:
    streams = [server.generate(gen.prompt, p, True, gen.keep_ids, gen.extra_inputs())
               for p in gen.choice_params()]
    tasks = [asyncio.ensure_future(_first(s)) for s in streams]
    try:
        firsts = await asyncio.gather(*tasks)
    except BaseException as e:   # one choice refused: the others stop, the answer is its error
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await s.aclose()
        if isinstance(e, TritonError):
            raise api_error(e, gen) from None
        raise
    return StreamingResponse(_events(gen, rid, firsts, streams, text_of),
                             media_type="text/event-stream", headers={"Cache-Control": "no-store"})


async def _merged(firsts: list[dict | None], streams: list[AsyncIterator[dict]]
                  ) -> AsyncIterator[tuple[int, dict | None]]:
    """Each choice's responses as they come, (i, outputs), and (i, None) at its end. Closing
    it cancels the gRPC streams that did not end (client gone)."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(i: int) -> None:
        try:
            if firsts[i] is not None:
                queue.put_nowait((i, firsts[i]))
                async for outputs in streams[i]:
                    queue.put_nowait((i, outputs))
            queue.put_nowait((i, None))
        except Exception as e:   # raised where the chunks are made
            queue.put_nowait((i, e))

    tasks = []
    try:
        if len(streams) == 1:   # one choice: read in place, no task between
            if firsts[0] is not None:
                yield 0, firsts[0]
                async for outputs in streams[0]:
                    yield 0, outputs
            yield 0, None
            return
        tasks = [asyncio.ensure_future(pump(i)) for i in range(len(streams))]
        left = len(streams)
        while left:
            i, item = await queue.get()
            if isinstance(item, Exception):
                raise item
            left -= item is None
            yield i, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for s in streams:
            await s.aclose()


class _Scores:
    """A streamed choice's logprobs not yet sent, and where its text offset stands."""

    def __init__(self, gen: Generation, text_of: TokenText):
        self.gen, self.text_of, self.pending, self.offset = gen, text_of, [], 0

    def take(self, prompt_scored: list | None = None) -> dict | None:
        """The logprobs field of the next chunk: what is pending (after the echoed prompt's)."""
        lp = protocol.choice_logprobs(self.gen, self.text_of, self.pending, prompt_scored,
                                      self.offset)
        if lp is not None and "text_offset" in lp and lp["tokens"]:
            self.offset = lp["text_offset"][-1] + len(lp["tokens"][-1])
        self.pending = []
        return lp


async def _events(gen: Generation, rid: str, firsts: list[dict | None],
                  streams: list[AsyncIterator[dict]], text_of: TokenText) -> AsyncIterator[str]:
    """SSE: a chunk per piece of text (or tool call) of each choice, each choice's finish chunk,
    the usage chunk if asked, [DONE]. With echo a choice's first chunk is the prompt; a chunk's
    logprobs are those of the tokens that came since the last chunk."""
    from specdec_client.stream import Collector
    created = int(time.time())
    collectors = [Collector() for _ in streams]
    readers = [tools.Stream(gen.tool_parser) if gen.tool_parser else None for _ in streams]
    scores = [_Scores(gen, text_of) for _ in streams]
    calls = [0] * len(streams)
    results = [None] * len(streams)
    for i in range(len(streams)):
        if gen.chat:
            yield _sse(protocol.chunk(gen, rid, created, None, first=True, index=i))
        elif gen.echo:
            prompt_scored = (firsts[i] or {}).get(PROMPT_SCORED)
            yield _sse(protocol.chunk(gen, rid, created, gen.prompt, index=i,
                                      logprobs=scores[i].take(prompt_scored)))
    merged = _merged(firsts, streams)
    try:
        async for i, outputs in merged:
            if outputs is not None:
                piece = collectors[i].add(outputs)
                scores[i].pending += outputs.get(SCORED) or []
                if piece:
                    for event in _choice(gen, rid, created, i, readers[i].feed(piece)
                                         if readers[i] else [piece], calls, scores[i]):
                        yield event
                continue
            if readers[i]:
                for event in _choice(gen, rid, created, i, readers[i].close(), calls,
                                     scores[i]):
                    yield event
            result = results[i] = collectors[i].result(streamed=True)
            finish = "tool_calls" if calls[i] else protocol.finish_reason(result)
            end = protocol.chunk(gen, rid, created, None, finish=finish, index=i,
                                 logprobs=scores[i].take() if scores[i].pending else None)
            end["specdec"] = protocol.speculation(result)
            yield _sse(end)
    except TritonError as e:   # after the first byte, the error goes in the stream
        yield _sse(api_error(e, gen).body())
        yield "data: [DONE]\n\n"
        return
    finally:
        await merged.aclose()
    if gen.include_usage:
        yield _sse(protocol.usage_chunk(gen, rid, created, results))
    yield "data: [DONE]\n\n"


def _choice(gen: Generation, rid: str, created: int, i: int, events: list,
            calls: list[int], scores: _Scores) -> Iterator[str]:
    """Choice i's chunks: its pieces of content, with the logprobs of the tokens since the
    last, and each call as OpenAI streams one."""
    for event in events:
        if isinstance(event, str):
            yield _sse(protocol.chunk(gen, rid, created, event, index=i,
                                      logprobs=scores.take() if scores.pending else None))
            continue
        for delta in protocol.call_deltas(gen, calls[i], event):
            yield _sse(protocol.chunk(gen, rid, created, None, index=i, tool_calls=delta))
        calls[i] += 1


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
