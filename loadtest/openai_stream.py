"""Streaming chat (or completions) over the OpenAI endpoint (`specdec openai`) for the load test.

One httpx2 client (one connection pool) per locust user; each request streams with
`stream_options.include_usage`, so the last chunk carries the token counts, and the gateway's
`specdec` field the acceptance. The pieces are collected with specdec_client's Collector: TTFT,
ITL and the rest mean what they mean for the Triton users (seconds since the request was sent,
one time per non-empty piece of text).
"""
from __future__ import annotations

from typing import Any

import httpx2

from specdec import names
from specdec_client import GenerationParams, Result, ServerError
from specdec_client.stream import Collector

# The gateway's per-request statistics, by the ensemble's output names.
SPECDEC_FIELDS = (names.TOTAL_DRAFT_TOKENS, names.TOTAL_ACCEPTED_DRAFT_TOKENS,
                  names.ACCEPTANCE_RATE, names.NGRAM_DRAFT_TOKENS, names.NGRAM_ACCEPTED_TOKENS)


class OpenAIStreamer:
    def __init__(self, base_url: str, model: str | None = None, api: str = "chat",
                 timeout: float = 120.0) -> None:
        self.client = httpx2.Client(base_url=base_url.rstrip("/") + "/v1", timeout=timeout)
        self.api = api
        self._model = model

    @property
    def model(self) -> str:
        """The served model (asked of /v1/models once when not given)."""
        if not self._model:
            response = self.client.get("/models")
            if response.status_code != 200:
                raise ServerError(response.text, response.status_code)
            self._model = response.json()["data"][0]["id"]
        return self._model

    def body(self, prompt: str, params: GenerationParams) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "stream_options": {"include_usage": True}}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        for name, value in params.fields().items():
            body["stop" if name == names.STOP_WORDS else name] = value
        return body

    def generate(self, prompt: str, params: GenerationParams, timeout: float,
                 cancel_after: int = 0) -> Result:
        """Stream one request to its end, or leave after `cancel_after` pieces (the gateway
        then cancels the generation); raises ServerError, TimeoutError or ConnectionError."""
        collector = Collector()
        path = "/chat/completions" if self.api == "chat" else "/completions"
        try:
            with self.client.sse(path, method="POST", json=self.body(prompt, params),
                                 timeout=timeout) as events:
                if events.response.status_code != 200:
                    events.response.read()
                    error = events.response.json().get("error", {})
                    raise ServerError(error.get("message", events.response.text),
                                      events.response.status_code)
                for event in events:
                    if event.data == "[DONE]":
                        break
                    chunk = event.json()
                    if "error" in chunk:
                        raise ServerError(chunk["error"].get("message", str(chunk)))
                    if collector.add(self._outputs(chunk)) and cancel_after and \
                            len(collector.pieces) >= cancel_after:
                        return collector.result(streamed=True, cancelled=True)
        except httpx2.TimeoutException as e:
            raise TimeoutError(f"no response within {timeout} s") from e
        except httpx2.TransportError as e:
            raise ConnectionError(str(e) or type(e).__name__) from e
        return collector.result(streamed=True)

    def _outputs(self, chunk: dict) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for choice in chunk.get("choices") or []:
            text = choice.get("delta", {}).get("content") if self.api == "chat" else \
                choice.get("text")
            if text:
                out[names.TEXT_OUTPUT] = text
            if choice.get("finish_reason"):
                out[names.FINISH_REASON] = choice["finish_reason"]
        usage = chunk.get("usage")
        if usage:
            out[names.NUM_INPUT_TOKENS] = usage["prompt_tokens"]
            out[names.NUM_OUTPUT_TOKENS] = usage["completion_tokens"]
        for name in SPECDEC_FIELDS:
            value = (chunk.get("specdec") or {}).get(name)
            if value is not None:
                out[name] = value
        return out

    def close(self) -> None:
        self.client.close()
