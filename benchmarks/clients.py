"""Requests to the ensemble over gRPC streaming, timed on the client: one at a time or through
N concurrent streams.

    reqs, wall_s = run_requests(server.grpc_url, list(enumerate(prompts)), k=4, max_tokens=64,
                                concurrency=16, label="K=4 x16")
    latency_summary(reqs)["tokens_per_s"], sum(r.tokens for r in reqs) / wall_s
"""
from __future__ import annotations

import queue
import threading
import time

from figures import Req
from progress import log


class GrpcClient:
    """One channel; one bidirectional stream per request, as a streaming client keeps its
    connection. Inputs take the rank the ensemble's metadata declares ([1, 1] with its batch
    dimension) instead of assuming one; times are taken in the response callback."""

    def __init__(self, url: str, stream: bool = True):
        from tritonclient.grpc import InferenceServerClient

        from specdec_client.grpc_transport import input_ranks, server_version, stream_headers
        self.client = InferenceServerClient(url)
        self.ranks = input_ranks(self.client, url, "ensemble")
        self.headers = stream_headers(server_version(self.client, url))
        self.stream = stream   # False: the ensemble's `stream` off, the answer in one response

    def _inputs(self, prompt: str, k: int, max_tokens: int, proposer: str | None) -> list:
        from specdec_client import GenerationParams
        from specdec_client.grpc_transport import build_infer_inputs
        return build_infer_inputs(prompt, GenerationParams(
            max_tokens=max_tokens, temperature=0.0, num_draft_tokens=k, proposer=proposer),
            self.stream, self.ranks)

    def request(self, prompt: str, index: int, k: int, max_tokens: int,
                proposer: str | None = None,
                timeout_s: float = 300.0) -> Req:
        import uuid

        from specdec_client.grpc_transport import close_stream
        q: queue.Queue = queue.Queue()
        inputs = self._inputs(prompt, k, max_tokens, proposer)
        self.client.start_stream(
            callback=lambda result, error: q.put((time.perf_counter(), result, error)),
            headers=self.headers)
        cancel = True   # until the request ends on its own: a final response or an error
        try:
            t0 = time.perf_counter()
            self.client.async_stream_infer("ensemble", inputs, request_id=uuid.uuid4().hex,
                                           enable_empty_final_response=True)
            times, counts, pieces, seen, finish = [], [], [], 0, None
            while True:
                t, result, error = q.get(timeout=timeout_s)
                if error is not None:
                    cancel = False
                    raise RuntimeError(f"server error: {error}")
                text = result.as_numpy("text_output")
                n = result.as_numpy("num_output_tokens")
                reason = result.as_numpy("finish_reason")
                piece = b"".join(text.reshape(-1)).decode("utf-8", "replace") if (
                    text is not None and text.size) else ""
                # A chunk is a response that carries new tokens (its text may be held back
                # a little by the streaming detokenizer; token arrival is what is timed).
                if n is not None and n.size and int(n.reshape(-1)[0]) > seen:
                    times.append(t - t0)
                    counts.append(int(n.reshape(-1)[0]) - seen)
                    seen = int(n.reshape(-1)[0])
                if piece:
                    pieces.append(piece)
                if reason is not None and reason.size and reason.reshape(-1)[0]:
                    finish = reason.reshape(-1)[0].decode()
                params = result.get_response().parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    cancel = False
                    break
            total = time.perf_counter() - t0
        finally:
            close_stream(self.client, cancel)
        return Req(index, seen, total, times[0] if times else None, times, counts,
                   "".join(pieces), finish)

    def close(self) -> None:
        self.client.close()


def server_request(url: str, prompt: str, index: int, k: int, max_tokens: int) -> Req:
    c = GrpcClient(url)
    try:
        return c.request(prompt, index, k, max_tokens)
    finally:
        c.close()


def run_requests(url: str, prompts: list[tuple[int, str]], k: int, max_tokens: int,
                 concurrency: int, label: str, progress: bool = True,
                 proposer: str | None = None, stream: bool = True) -> tuple[list[Req], float]:
    """Send prompts through `concurrency` streams; returns (requests, wall seconds).
    k: num_draft_tokens (-1: auto); proposer: draft, ngram, hybrid (None: the server's);
    stream: False asks each answer in one response."""
    todo: queue.Queue = queue.Queue()
    for p in prompts:
        todo.put(p)
    done: list[Req] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def worker(client):
        try:
            work(client)
        finally:
            client.close()

    def work(client):
        while not errors:
            try:
                i, prompt = todo.get_nowait()
            except queue.Empty:
                return
            try:
                r = client.request(prompt, i, k, max_tokens, proposer)
            except BaseException as e:  # reported below, after the other streams stop
                errors.append(e)
                return
            with lock:
                done.append(r)
                if progress and (concurrency == 1 or len(done) % concurrency == 0
                                 or len(done) == len(prompts)):
                    log(f"{label}: {len(done)}/{len(prompts)} requests")

    wall = run_streams([GrpcClient(url, stream) for _ in range(concurrency)], worker, errors,
                       label)
    return sorted(done, key=lambda r: r.prompt_index), wall


def run_streams(clients: list, worker, errors: list[BaseException], label: str) -> float:
    """worker(client) on a thread per client; wall seconds until all end. The first error a
    worker appended is raised once every stream has stopped."""
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in clients]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{label}: request failed: {errors[0]!r}") from errors[0]
    return wall
