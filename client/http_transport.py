"""HTTP transport over httpx2: Triton's generate and generate_stream (server-sent events).

One client (one connection) a request, as before. Transport failures keep the standard
library's types that callers catch: a timeout is TimeoutError, a refused or broken connection a
ConnectionError (both OSError). Cancelling a stream shuts its socket down, which also wakes a
reader blocked on it in another thread.
"""
from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote, urlsplit

import httpx2

from .wire import (GenerationParams, Result, ServerError, build_generate_body, decode_event,
                   outputs_from_json)
from .stream import Collector, TextStream


def _endpoint(url: str, model: str, name: str) -> str:
    parts = urlsplit(url if "://" in url else "http://" + url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an HTTP URL: {url!r}")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}" \
           f"/v2/models/{quote(model, safe='')}/{name}"


def _error_message(raw: bytes, fallback: str) -> str:
    text = raw.decode("utf-8", "replace").strip()
    if text.startswith("data:"):   # generate_stream sends its error as one SSE event
        text = text[len("data:"):].strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text or fallback
    if isinstance(obj, dict) and "error" in obj:
        return str(obj["error"])
    return text or fallback


@contextmanager
def _standard_errors() -> Iterator[None]:
    try:
        yield
    except httpx2.TimeoutException as e:
        raise TimeoutError(f"no response from the server in time: {e}") from e
    except httpx2.TransportError as e:
        raise ConnectionError(str(e) or type(e).__name__) from e


def _check(response: httpx2.Response) -> None:
    if response.status_code != 200:
        raw = response.read()
        raise ServerError(_error_message(raw, response.reason_phrase), response.status_code)


def generate(url: str, prompt: str, params: GenerationParams | None, model: str,
             timeout: float | None) -> Result:
    collector = Collector()
    with _standard_errors(), httpx2.Client(timeout=timeout) as client:
        response = client.post(_endpoint(url, model, "generate"),
                               json=build_generate_body(prompt, params, False))
        _check(response)
        collector.add(outputs_from_json(decode_event(response.content)))
    return collector.result(streamed=False)


class _HttpStream(TextStream):
    def __init__(self, client: httpx2.Client, response: httpx2.Response,
                 collector: Collector) -> None:
        super().__init__(collector, streamed=True)
        self._client, self._response = client, response
        self._events = iter(httpx2.EventSource(response))
        self._closed = False
        self._close_lock = threading.Lock()

    def _receive(self) -> dict[str, Any] | None:
        with _standard_errors():
            event = next(self._events, None)
        return None if event is None else outputs_from_json(decode_event(event.data))

    def _abort(self) -> None:
        """Shut the socket down (waking a reader in another thread), then close."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
            stream = self._response.extensions.get("network_stream")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        try:
            self._response.close()
        finally:
            self._client.close()


def open_stream(url: str, prompt: str, params: GenerationParams | None, model: str,
                timeout: float | None) -> TextStream:
    collector = Collector()
    client = httpx2.Client(timeout=timeout)
    try:
        with _standard_errors():
            request = client.build_request(
                "POST", _endpoint(url, model, "generate_stream"),
                json=build_generate_body(prompt, params, True),
                headers={"Accept": "text/event-stream"})
            response = client.send(request, stream=True)
            try:
                _check(response)
            except BaseException:
                response.close()
                raise
    except BaseException:
        client.close()
        raise
    return _HttpStream(client, response, collector)
