"""The routes: /v1/models, /v1/chat/completions, /v1/completions, and the gateway's probes.

A streamed answer's HTTP status is decided before its first byte: the first response from the
server is awaited first, so a refusal or a full server is a 400 or a 503, not an error inside
a 200 stream. A client that goes away cancels its generation: a stream's generator is cancelled
by the server, a non-streamed request is watched for the disconnect while it runs.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import protocol
from .limits import Limits
from .protocol import ApiError, Generation
from .triton import SpecDecoding, TritonError, api_error

DISCONNECT_POLL_S = 0.25


def create_app(server: SpecDecoding, tokenizer, served: str,
               limits: Limits = Limits()) -> FastAPI:
    app = FastAPI(title="triton-specdec OpenAI-compatible API", docs_url=None, redoc_url=None,
                  openapi_url=None)
    created = int(time.time())

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
            await _body(request), served, tokenizer, limits.server))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _serve(request, server, protocol.parse_completion(
            await _body(request), served, limits.server))

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


async def _serve(request: Request, server: SpecDecoding, gen: Generation) -> Response:
    rid = protocol.new_id(gen.chat)
    if gen.stream:
        return await _stream(server, gen, rid)
    task = asyncio.ensure_future(server.collect(gen))
    try:
        while not task.done():   # a client that leaves cancels its generation
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if not task.done() and await request.is_disconnected():
                task.cancel()
                return Response(status_code=499)
        collector = task.result()
    except TritonError as e:
        raise api_error(e, gen) from None
    finally:
        if not task.done():
            task.cancel()
    return JSONResponse(protocol.response(gen, rid, collector.result(streamed=False)))


async def _stream(server: SpecDecoding, gen: Generation, rid: str) -> Response:
    responses = server.generate(gen.prompt, gen.params, True)
    try:
        first = await responses.__anext__()
    except StopAsyncIteration:
        first = None
    except TritonError as e:
        raise api_error(e, gen) from None
    return StreamingResponse(_events(gen, rid, first, responses), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store"})


async def _events(gen: Generation, rid: str, first: dict | None,
                  responses: AsyncIterator[dict]) -> AsyncIterator[str]:
    """SSE: a chunk per piece of text, the finish chunk, the usage chunk if asked, [DONE]."""
    from specdec_client.stream import Collector
    created = int(time.time())
    collector = Collector()
    if gen.chat:
        yield _sse(protocol.chunk(gen, rid, created, None, first=True))
    try:
        pending = [first] if first is not None else []
        while True:
            outputs = pending.pop() if pending else await responses.__anext__()
            piece = collector.add(outputs)
            if piece:
                yield _sse(protocol.chunk(gen, rid, created, piece))
    except StopAsyncIteration:
        pass
    except TritonError as e:   # after the first byte, the error goes in the stream
        yield _sse(api_error(e, gen).body())
        yield "data: [DONE]\n\n"
        return
    finally:
        await responses.aclose()   # cancels the gRPC stream if it did not end (client gone)
    result = collector.result(streamed=True)
    end = protocol.chunk(gen, rid, created, None, finish=protocol.finish_reason(result))
    end["specdec"] = protocol.speculation(result)
    yield _sse(end)
    if gen.include_usage:
        yield _sse(protocol.usage_chunk(gen, rid, created, result))
    yield "data: [DONE]\n\n"


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"
