"""The load test ends at its duration even when the server never answers: each silent stream
is a failure with a timeout, never a hang (stand-in servers on 127.0.0.1, real locust)."""
from __future__ import annotations

import csv
import importlib.util
import socket
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import pytest

grpc = pytest.importorskip("grpc")
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DURATION_S = 6
TIMEOUT_S = 2


class Silent(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Knows the ensemble's inputs, accepts every stream, answers none."""

    def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name="triton", version="2.51.0")

    def ModelMetadata(self, request, context):
        meta = service_pb2.ModelMetadataResponse(name=request.name)
        for name in ("text_input", "stream", "max_tokens", "temperature", "num_draft_tokens"):
            meta.inputs.add(name=name, shape=[-1, 1])
        return meta

    def ModelStreamInfer(self, request_iterator, context):
        for _ in request_iterator:
            while context.is_active():
                time.sleep(0.05)
        return
        yield


def silent_http(stop: threading.Event) -> int:
    """A TCP server that reads requests and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    held = []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            held.append(conn)
        for conn in held:
            conn.close()
        listener.close()
    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1]


@pytest.mark.skipif(importlib.util.find_spec("locust") is None, reason="locust is not installed")
def test_the_load_test_stops_at_its_duration_when_no_stream_ends(tmp_path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(Silent(), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    stop = threading.Event()
    http_port = silent_http(stop)
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(ROOT / "loadtest" / "locustfile.py"),
             "--headless", "-u", "4", "-r", "4", "-t", f"{DURATION_S}s",
             "--host", f"http://127.0.0.1:{http_port}", "--grpc-host", f"127.0.0.1:{grpc_port}",
             "--request-timeout", str(TIMEOUT_S), "--failure-backoff", "0", "--only-summary",
             "--csv", str(tmp_path / "lt")],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
        wall = time.monotonic() - t0
    finally:
        stop.set()
        server.stop(0)
    log = (proc.stdout + proc.stderr)[-4000:]
    # Locust's start, the duration, and one request timeout for the streams cut at the end.
    assert wall < DURATION_S + 30, f"locust took {wall:.1f} s:\n{log}"
    assert proc.returncode == 1, log   # failures, not a crash (2) or a kill
    with open(tmp_path / "lt_failures.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    kinds = {row["Method"] for row in rows}
    assert kinds == {"SSE", "gRPC"}, rows
    for row in rows:
        assert "TimeoutError" in row["Error"] or "timed out" in row["Error"], row
