"""A generation's responses as they arrive: the Collector that keeps text, statistics and
arrival times, and the TextStream that a transport (http_transport.py, grpc_transport.py)
subclasses with how it receives and aborts."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from specdec.names import (ACCEPTANCE_RATE, FINISH_REASON, NGRAM_ACCEPTED_TOKENS,
                           NGRAM_DRAFT_TOKENS, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS,
                           STATS_OUTPUTS, TEXT_OUTPUT, TOTAL_ACCEPTED_DRAFT_TOKENS,
                           TOTAL_DRAFT_TOKENS)

from .wire import FINISH_CANCELLED, Result


class Collector:
    """Accumulates text, the latest statistics and arrival times of responses."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.pieces: list[str] = []
        self.times: list[float] = []
        self.stats: dict[str, Any] = {}

    def add(self, outputs: dict[str, Any]) -> str:
        for name in STATS_OUTPUTS:
            value = outputs.get(name)
            if value is not None and value != "":
                self.stats[name] = value
        piece = outputs.get(TEXT_OUTPUT) or ""
        if piece:
            self.pieces.append(piece)
            self.times.append(time.perf_counter() - self.t0)
        return piece

    def result(self, streamed: bool, cancelled: bool = False) -> Result:
        s = self.stats

        def num(name: str, kind: type) -> Any:
            return kind(s[name]) if name in s else None

        return Result(
            text="".join(self.pieces),
            num_output_tokens=num(NUM_OUTPUT_TOKENS, int),
            num_input_tokens=num(NUM_INPUT_TOKENS, int),
            total_draft_tokens=num(TOTAL_DRAFT_TOKENS, int),
            total_accepted_draft_tokens=num(TOTAL_ACCEPTED_DRAFT_TOKENS, int),
            acceptance_rate=num(ACCEPTANCE_RATE, float),
            finish_reason=FINISH_CANCELLED if cancelled else num(FINISH_REASON, str),
            ngram_draft_tokens=num(NGRAM_DRAFT_TOKENS, int),
            ngram_accepted_tokens=num(NGRAM_ACCEPTED_TOKENS, int),
            time_to_first_token_s=self.times[0] if streamed and self.times else None,
            total_time_s=time.perf_counter() - self.t0,
            chunk_times_s=list(self.times),
        )


class TextStream(Iterator[str]):
    """The text pieces of one generation, in arrival order.

    Iterating yields non-empty pieces; once the server's last response is read,
    ``result`` holds the Result. ``cancel()`` (from any thread, or by leaving a
    ``with`` block early) cancels the request and ends the iteration with
    finish_reason "cancelled"; the server ends the generation at its next
    round and frees its slots (through the ensemble too: README, "How it
    works").
    """

    def __init__(self, collector: Collector, streamed: bool) -> None:
        self._collector = collector
        self._streamed = streamed
        self._result: Result | None = None
        self._done = False
        self._cancelled = threading.Event()
        self._lock = threading.Lock()

    def _receive(self) -> dict[str, Any] | None:
        """The next response's outputs, or None after the last one."""
        raise NotImplementedError

    def _abort(self) -> None:
        """Stop the request and free the connection; must be idempotent."""
        raise NotImplementedError

    def _release(self) -> None:
        """Free the connection after the last response."""
        self._abort()

    def _fail(self, error: BaseException) -> None:
        """Free the connection after `error` ended the stream (an error the server sent is
        its last response; a broken or silent stream must be cut)."""
        self._abort()

    @property
    def result(self) -> Result | None:
        return self._result

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def __next__(self) -> str:
        while not self._done:
            if self._cancelled.is_set():
                self._finish()
                break
            try:
                outputs = self._receive()
            except BaseException as e:
                if self._cancelled.is_set():
                    self._finish()
                    break
                self._done = True
                self._fail(e)
                raise
            if outputs is None:
                self._finish()
                break
            piece = self._collector.add(outputs)
            if piece:
                return piece
        raise StopIteration

    def _finish(self) -> None:
        self._done = True
        cancelled = self._cancelled.is_set()
        if cancelled:
            self._abort()
        else:
            self._release()
        self._result = self._collector.result(self._streamed, cancelled)

    def cancel(self) -> None:
        """Stop the generation early; what arrived so far stays in the result."""
        if self._done:
            return
        self._cancelled.set()
        self._abort()

    def wait(self) -> Result:
        """Read the remaining pieces and return the Result."""
        for _ in self:
            pass
        if self._result is None:
            raise RuntimeError("the stream ended with an error")
        return self._result

    def __enter__(self) -> TextStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.cancel()
