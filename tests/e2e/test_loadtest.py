"""The locust load test, headless, against the session's real tritonserver.

locust runs as a subprocess: importing it here would monkey-patch this pytest process with gevent.
"""
from __future__ import annotations

import csv
import importlib.util
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from loadtest.prompts import BUILTIN_PROMPTS, Mix, load_prompts, parse_int_list, parse_k_list

ROOT = Path(__file__).resolve().parents[2]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
USERS = 3
DURATION_S = 8
MIN_REQUESTS = 4
STREAM_METRICS = ("TTFT", "ITL", "TPOT", "TOK/S")

needs_locust = pytest.mark.skipif(importlib.util.find_spec("locust") is None,
                                  reason="locust is not installed (pip install locust)")


def run_locust(http: str, grpc: str, out: Path, *extra: str,
               users: int = USERS, duration_s: int = DURATION_S) -> subprocess.CompletedProcess:
    """Headless locust against http / grpc (host:port), reports under out/."""
    cmd = [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
           "-u", str(users), "-r", str(users), "-t", f"{duration_s}s",
           "--host", f"http://{http}", "--grpc-host", grpc,
           "--num-draft-tokens", "4,0", "--max-tokens", "16", "--sampled-ratio", "0.5",
           "--mix-seed", "0", "--only-summary",
           "--csv", str(out / "loadtest"), "--html", str(out / "loadtest.html"), *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=duration_s + 60)


def read_stats(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    with open(out / "loadtest_stats.csv", newline="") as f:
        return {(row["Type"], row["Name"]): row for row in csv.DictReader(f)}


@needs_locust
def test_headless_locust_over_http_and_grpc_writes_stream_statistics(server, tmp_path):
    t0 = time.monotonic()
    proc = run_locust(server.http, server.grpc, tmp_path)
    wall = time.monotonic() - t0
    log = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"locust exited {proc.returncode}:\n{log}"
    assert wall < 30, f"the load test took {wall:.1f} s"

    stats = read_stats(tmp_path)
    count = {key: int(row["Request Count"]) for key, row in stats.items()}
    failures = {key: int(row["Failure Count"]) for key, row in stats.items()}
    assert sum(failures.values()) == 0, f"failures: {failures}\n{log}"
    failures_csv = (tmp_path / "loadtest_failures.csv").read_text().strip().splitlines()
    assert len(failures_csv) == 1, failures_csv  # the header only

    by_type: dict[str, int] = {}
    for (kind, name), n in count.items():
        if name != "Aggregated":
            by_type[kind] = by_type.get(kind, 0) + n
    requests = by_type.get("SSE", 0) + by_type.get("gRPC", 0)
    assert requests >= MIN_REQUESTS, f"{requests} requests in {DURATION_S} s: {by_type}\n{log}"
    assert by_type.get("SSE", 0) > 0 and by_type.get("gRPC", 0) > 0, by_type
    for kind in STREAM_METRICS:
        assert by_type.get(kind, 0) > 0, f"no {kind} entries: {by_type}"
        for (k, _name), row in stats.items():
            if k == kind and int(row["Request Count"]):
                assert float(row["Average Response Time"]) > 0, row
    # One TTFT per request with tokens (a sampled request may end on EOS at once, with none);
    # ACCEPT% only for the speculative requests.
    assert requests - requests // 4 <= by_type["TTFT"] <= requests, by_type
    names = {name for (kind, name) in count if kind in ("SSE", "gRPC")}
    assert any(n.startswith("K=4 ") for n in names) and any(n.startswith("K=0 ") for n in names)
    assert all(name.startswith("K=4 ") for (kind, name) in count if kind == "ACCEPT%")
    assert by_type.get("ACCEPT%", 0) > 0

    html = tmp_path / "loadtest.html"
    assert html.is_file() and html.stat().st_size > 0
    assert "TTFT" in html.read_text(errors="replace")
    assert "Speculative decoding summary" in proc.stderr


@needs_locust
def test_server_errors_are_failures_and_fail_the_run(server, tmp_path):
    proc = run_locust(server.http, server.grpc, tmp_path, "--max-tokens", "100000",
                      users=2, duration_s=2)
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-4000:]
    stats = read_stats(tmp_path)
    requests = sum(int(r["Request Count"]) for (k, _), r in stats.items() if k in ("SSE", "gRPC"))
    failures = sum(int(r["Failure Count"]) for (k, _), r in stats.items() if k in ("SSE", "gRPC"))
    assert requests > 0 and failures == requests
    assert not any(k in STREAM_METRICS for (k, _) in stats)
    errors = (tmp_path / "loadtest_failures.csv").read_text()
    assert "max_tokens" in errors and "request id" not in errors


HANGING_QUIT = """
import sys, threading
sys.path.insert(0, {root!r})
from locust import events
from loadtest.locustfile import *  # noqa: F403: the load test's users and listeners
import gevent.monkey


def never_ends():
    threading.Event().wait()


def blocks_forever():
    gevent.monkey.get_original("time", "sleep")(3600)


@events.quit.add_listener
def on_quit(**_kwargs):
    {body}
"""
# A non-daemon thread that never ends, started as locust exits: the interpreter's teardown
# would wait for it forever (as gRPC's under gevent once did in CI).
A_THREAD = 'threading.Thread(target=never_ends, name="never-ends").start()'
# A quit listener that never returns: only the watchdog's OS thread can end the run.
BLOCKED = "blocks_forever()"


def run_hanging(server, tmp_path, body: str) -> tuple[subprocess.CompletedProcess, float]:
    locustfile = tmp_path / "hanging_locustfile.py"
    locustfile.write_text(HANGING_QUIT.format(root=str(ROOT), body=body))
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "2",
           "-r", "2", "-t", "2s", "--host", f"http://{server.http}", "--grpc-host", server.grpc,
           "--max-tokens", "100000", "--only-summary", "--exit-watchdog", "2",
           "--csv", str(tmp_path / "hanging")]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    return proc, time.monotonic() - t0


@needs_locust
def test_locust_leaves_without_the_teardown_a_thread_would_hang(server, tmp_path):
    proc, wall = run_hanging(server, tmp_path, A_THREAD)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-6000:]   # the run's failed requests (max_tokens refused)
    assert "had not exited" not in log, log[-6000:]   # no watchdog needed
    assert wall < 20, wall
    # Its results are complete: the CSV files closed, not cut off by the exit.
    stats = (tmp_path / "hanging_stats.csv").read_text()
    assert stats.rstrip().splitlines()[-1].split(",")[1] == "Aggregated", stats
    assert "max_tokens" in (tmp_path / "hanging_failures.csv").read_text()


@needs_locust
def test_a_quit_listener_that_hangs_ends_within_the_exit_watchdog_with_the_runs_exit_code(
        server, tmp_path):
    proc, wall = run_hanging(server, tmp_path, BLOCKED)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log[-6000:]   # the run's failed requests, not the watchdog's
    assert "had not exited 2 s after writing its results" in log, log[-6000:]
    assert "blocks_forever" in log, log[-6000:]   # the dump names what the exit waited on
    assert wall < 30, wall


@needs_locust
def test_streaming_chat_over_the_openai_endpoint(server, tmp_path, tmp_path_factory):
    """The OpenAI user alone, through a gateway with a chat template on the session's server:
    TTFT, ITL, TPOT and ACCEPT% rows like the Triton users', a tenth cancelled by leaving."""
    from tests.e2e.conftest import start_gateway, templated_tokenizer
    gateway, url = start_gateway(server.grpc, templated_tokenizer(tmp_path_factory),
                                 tmp_path_factory)
    try:
        proc = run_locust(server.http, server.grpc, tmp_path, "--openai-host", url,
                          "--openai-weight", "1", "--http-weight", "0", "--grpc-weight", "0",
                          "--cancel-ratio", "0.1")
    finally:
        gateway.terminate()
        gateway.wait(30)
    log = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, log
    stats = read_stats(tmp_path)
    by_type: dict[str, int] = {}
    for (kind, name), row in stats.items():
        if name != "Aggregated":
            by_type[kind] = by_type.get(kind, 0) + int(row["Request Count"])
            assert int(row["Failure Count"]) == 0, row
    assert set(by_type) >= {"OpenAI", "TTFT", "ITL", "TPOT", "TOK/S", "ACCEPT%"}, by_type
    assert "SSE" not in by_type and "gRPC" not in by_type
    assert by_type["OpenAI"] >= MIN_REQUESTS, by_type


@needs_locust
def test_non_loopback_hosts_are_refused(tmp_path):
    proc = run_locust("192.0.2.1:8000", "192.0.2.1:8001", tmp_path, duration_s=1)
    assert proc.returncode == 2 and "not a loopback address" in proc.stderr


def test_prompts_and_request_mix(tmp_path):
    assert load_prompts("builtin") == list(BUILTIN_PROMPTS)
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps(o) for o in
                           [{"prompt": "def a():\n"}, "class B:\n", {"text_input": "import c"}]))
    assert load_prompts(f) == ["def a():\n", "class B:\n", "import c"]
    assert load_prompts(f, limit=2, max_chars=3) == ["):\n", "B:\n"]
    assert parse_int_list("4, 0", "K") == [4, 0]
    with pytest.raises(ValueError):
        parse_int_list("4,-1", "K")
    assert parse_k_list("auto, 4,0", "K") == [None, 4, 0]
    for bad in ("", "4,-1", "automatic"):
        with pytest.raises(ValueError):
            parse_k_list(bad, "K")

    mix = Mix(["p"], [4, 0, 2], max_tokens=8, sampled_ratio=0.25, rng=random.Random(1))
    plans = [mix.next() for _ in range(600)]
    assert [p.num_draft_tokens for p in plans[:6]] == [4, 0, 2, 4, 0, 2]
    assert 0.18 < sum(p.sampled for p in plans) / len(plans) < 0.32
    assert all(p.max_tokens == 8 for p in plans)
    assert all(not p.sampled for p in
               (Mix(["p"], [4], 8, sampled_ratio=0.0).next() for _ in range(50)))
