"""What the OpenAI gateway costs: TTFT and inter-token latency through `specdec openai` against
gRPC straight to the ensemble, at 1 and 16 streams, interleaved in one run on one server.

Both sides send the same greedy requests (the held-out prompts, fixed K so that every response
carries the same tokens on both) and must get the same text. The gateway streams completions
(no chat template, so the prompt tokens are the same); each Triton response becomes one SSE
chunk, so the gap between chunks measures the same thing on both sides: ITL here is that gap.
Repeats alternate which side goes first.

    .venv/bin/python benchmarks/gateway.py [--repeats 3] [--prompts 32] [--max-tokens 64]

Markdown on stdout, JSON in reports/. Goal (docs/openai.md): the gateway adds at most
5 % to ITL.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from clients import GrpcClient
from figures import Req, percentile
from inputs import DEFAULT_PROMPTS, ROOT, load_prompts
from machine import git_state, machine
from progress import log
from server import Server, exit_on_sigterm

CONCURRENCY = (1, 16)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gateway:
    """`specdec openai` in front of the server, on a free port. env: the server's SPECDEC_*
    settings, which the gateway reads as the server does (its limits, what it drafts with)."""

    def __init__(self, grpc_url: str, workdir: Path, env: dict[str, str] | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "gateway.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specdec.cli", "openai", "--grpc-url", grpc_url,
                 "--port", str(self.port)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})})
        deadline = time.monotonic() + 120
        while not self._live():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not start:\n{self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        self.model = json.loads(urllib.request.urlopen(f"{self.url}/v1/models").read()
                                )["data"][0]["id"]

    def _live(self) -> bool:
        try:
            return urllib.request.urlopen(f"{self.url}/health/live", timeout=2).status == 200
        except OSError:
            return False

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


class OpenAIClient:
    """One httpx2 connection pool; streamed completions, timed as the gRPC client times."""

    def __init__(self, gateway: Gateway):
        import httpx2
        self.gateway = gateway
        self.client = httpx2.Client(base_url=gateway.url + "/v1", timeout=300)

    def body(self, prompt: str, k: int, max_tokens: int, proposer: str | None) -> dict:
        """A streamed greedy completion; num_draft_tokens and proposer are the gateway's
        extensions (docs/openai.md)."""
        body = {"model": self.gateway.model, "prompt": prompt, "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "num_draft_tokens": k}
        return body if proposer is None else {**body, "proposer": proposer}

    def request(self, prompt: str, index: int, k: int, max_tokens: int,
                proposer: str | None = None) -> Req:
        body = self.body(prompt, k, max_tokens, proposer)
        times, pieces, tokens, finish = [], [], 0, None
        t0 = time.perf_counter()
        with self.client.sse("/completions", method="POST", json=body) as events:
            if events.response.status_code != 200:
                events.response.read()
                raise RuntimeError(f"gateway error: {events.response.text}")
            for event in events:
                if event.data == "[DONE]":
                    break
                chunk = event.json()
                for choice in chunk["choices"]:
                    if choice["text"]:
                        times.append(time.perf_counter() - t0)
                        pieces.append(choice["text"])
                    finish = choice["finish_reason"] or finish
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
        total = time.perf_counter() - t0
        return Req(index, tokens, total, times[0] if times else None, times, [1] * len(times),
                   "".join(pieces), finish)

    def close(self) -> None:
        self.client.close()


def run(make_client, prompts: list[str], k: int, max_tokens: int, concurrency: int,
        label: str) -> list[Req]:
    todo: queue.Queue = queue.Queue()
    for item in enumerate(prompts):
        todo.put(item)
    done, errors = [], []

    def worker():
        client = make_client()
        try:
            while not errors:
                try:
                    i, prompt = todo.get_nowait()
                except queue.Empty:
                    return
                done.append(client.request(prompt, i, k, max_tokens))
        except BaseException as e:   # reported after the other workers stop
            errors.append(e)
        finally:
            client.close()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{label}: {errors[0]!r}") from errors[0]
    log(f"{label}: {len(done)} requests")
    return sorted(done, key=lambda r: r.prompt_index)


def chunk_gaps(reqs: list[Req]) -> list[float]:
    return [b - a for r in reqs for a, b in zip(r.chunk_times_s, r.chunk_times_s[1:])]


def summary(reqs: list[Req]) -> dict:
    gaps = chunk_gaps(reqs)
    ttft = [r.ttft_s for r in reqs if r.ttft_s is not None]
    return {"requests": len(reqs), "chunks": sum(len(r.chunk_times_s) for r in reqs),
            "ttft_p50_ms": 1000 * percentile(ttft, 50),
            "ttft_mean_ms": 1000 * sum(ttft) / len(ttft),
            "itl_mean_ms": 1000 * sum(gaps) / len(gaps), "itl_p50_ms": 1000 * percentile(gaps, 50),
            "itl_p99_ms": 1000 * percentile(gaps, 99)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--k", type=int, default=4, help="num_draft_tokens, fixed on both sides")
    ap.add_argument("--out", type=Path, default=ROOT / "reports")
    args = ap.parse_args(argv)
    exit_on_sigterm()
    prompts = load_prompts(DEFAULT_PROMPTS, args.prompts)
    runs: dict[str, list[Req]] = {}
    with Server() as server:
        gateway = Gateway(server.grpc_url, server.workdir, server.env)
        try:
            sides = {"gRPC": lambda: GrpcClient(server.grpc_url),
                     "OpenAI": lambda: OpenAIClient(gateway)}
            for c in CONCURRENCY:
                n = args.prompts if c == 1 else max(args.prompts, 2 * c)
                batch = (prompts * ((n + len(prompts) - 1) // len(prompts)))[:n]
                for rep in range(args.repeats):
                    order = ["gRPC", "OpenAI"] if rep % 2 == 0 else ["OpenAI", "gRPC"]
                    for side in order:
                        reqs = run(sides[side], batch, args.k, args.max_tokens, c,
                                   f"{side} x{c} repeat {rep + 1}")
                        runs.setdefault(f"{side} x{c}", []).extend(reqs)
        finally:
            gateway.stop()
    rows, ratios = {label: summary(reqs) for label, reqs in runs.items()}, {}
    for c in CONCURRENCY:
        grpc, oai = runs[f"gRPC x{c}"], runs[f"OpenAI x{c}"]
        same = all(a.text == b.text for a, b in zip(grpc, oai))
        g, o = rows[f"gRPC x{c}"], rows[f"OpenAI x{c}"]
        ratios[c] = {"itl_mean": o["itl_mean_ms"] / g["itl_mean_ms"],
                     "itl_p50": o["itl_p50_ms"] / g["itl_p50_ms"],
                     "ttft_p50": o["ttft_p50_ms"] / g["ttft_p50_ms"], "same_text": same}
    stamp = datetime.date.today().isoformat()
    report = {"date": stamp, "machine": machine(), "git": git_state(), "args": vars(args),
              "rows": rows, "ratios": ratios}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stamp}-gateway.json").write_text(json.dumps(report, indent=1, default=str))
    print("| side | streams | requests | chunks | TTFT p50 ms | ITL mean ms | ITL p50 ms | "
          "ITL p99 ms |\n|---|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        side, c = label.split(" x")
        print(f"| {side} | {c} | {r['requests']} | {r['chunks']} | {r['ttft_p50_ms']:.1f} | "
              f"{r['itl_mean_ms']:.2f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} |")
    print()
    for c, r in ratios.items():
        print(f"{c} stream(s): OpenAI / gRPC  ITL mean {r['itl_mean']:.3f}, ITL p50 "
              f"{r['itl_p50']:.3f}, TTFT p50 {r['ttft_p50']:.3f}; same text: {r['same_text']}")
    if not all(r["same_text"] for r in ratios.values()):
        print("the gateway's text differs from the ensemble's", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
