"""Soak: locust at saturation for a long time against a real tritonserver, then what it left.

    python -m loadtest.soak --duration 10m          (make soak: its own server, free ports)

HTTP SSE and gRPC streaming users, greedy and sampled, K auto/4/0, a tenth of the requests
cancelled mid-stream by their client (the SSE users only, on a Triton older than 2.57: see the
locustfile's --cancel-ratio). Every 10 s the resident memory (VmRSS) of each server
process (tritonserver and each model's backend process) is sampled; its slope in MiB/min is
fitted over the run after the first fifth (allocator and cache warm-up). After the run, once
the streams have drained: the KV slots still held (leaked) and the gauges. Goals: no unexpected
failure, no slot leaked, memory flat. A JSON report and a markdown summary go to --out.

The CI test (tests/e2e/test_soak.py) runs `soak` for 60 s on the test session's server with the
same checks.
"""
from __future__ import annotations

import argparse
import csv
import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from specdec.launcher.procs import server_processes

ROOT = Path(__file__).resolve().parents[1]
LOCUSTFILE = ROOT / "loadtest" / "locustfile.py"
REQUEST_TYPES = ("SSE", "gRPC")
MIB = 1024 * 1024
# Memory may rise this much per minute in any process before `problems` calls it a leak; a CI
# minute is short and noisy, so its bound is looser than a long run's.
RSS_SLOPE_LIMIT_MIB_PER_MIN = 2.0
# The processes that may hold an engine (by default speculative_decoding, with the target
# hosted): their RSS wanders by 10-40 MiB over tens of seconds under load with no trend
# (target_model, 3 minutes of 0.25-s samples: 387-428 MiB; slopes fitted over 40-s windows
# from -29 to +11 MiB/min), where the others' rise smoothly.
ENGINE_PROCESSES = ("speculative_decoding", "target_model", "draft_model")


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / MIB
    except OSError:
        pass
    return None


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 2:
        return 0.0
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    var = sum((t - mx) ** 2 for t, _ in points)
    return 60.0 * sum((t - mx) * (v - my) for t, v in points) / var if var else 0.0


class Sampler:
    """RSS of every server process every `interval_s`, by process name; a process that gets a
    new pid (a restarted model, or tritonserver restarted by the launcher) starts a new series.
    `pid`: the launcher's."""

    def __init__(self, pid: int, interval_s: float):
        self.pid, self.interval_s = pid, interval_s
        self.series: dict[str, list[tuple[float, float]]] = {}
        self.pids: dict[str, int] = {}
        self.restarted: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = time.monotonic()

    def sample(self) -> None:
        now = time.monotonic() - self.t0
        for name, pid in server_processes(self.pid).items():
            if self.pids.setdefault(name, pid) != pid:
                self.pids[name] = pid
                self.restarted.add(name)
                self.series[name] = []
            mib = rss_mib(pid)
            if mib is not None:
                self.series.setdefault(name, []).append((now, mib))

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()


def metric(metrics: str, name: str, **labels) -> float:
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
    total = 0.0
    for line in text.splitlines():
        if (line.startswith(name + "{") or line.startswith(name + " ")) and \
                all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def locust_command(http: str, grpc: str, out: Path, users: int, duration_s: int,
                   max_tokens: int, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
            "-u", str(users), "-r", str(users), "-t", f"{duration_s}s",
            "--host", f"http://{http}", "--grpc-host", grpc,
            "--num-draft-tokens", "auto,4,0", "--sampled-ratio", "0.5", "--cancel-ratio", "0.1",
            "--max-tokens", str(max_tokens), "--request-timeout", "120", "--only-summary",
            "--csv", str(out / "soak"), *extra]


def request_counts(out: Path) -> dict[str, int]:
    """Requests, failures and cancelled requests over the SSE and gRPC users."""
    counts = {"requests": 0, "failures": 0, "cancelled": 0}
    if not (out / "soak_stats.csv").exists():   # locust was killed before writing it
        return counts
    with open(out / "soak_stats.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["Type"] in REQUEST_TYPES and row["Name"] != "Aggregated":
                counts["requests"] += int(row["Request Count"])
                counts["failures"] += int(row["Failure Count"])
                if row["Name"].endswith(" cancelled"):
                    counts["cancelled"] += int(row["Request Count"])
    return counts


def soak(http: str, grpc: str, metrics: str, pid: int, duration_s: int, users: int, out: Path,
         interval_s: float = 10.0, max_tokens: int = 64, extra: list[str] = (),
         warm_s: float | None = None) -> dict:
    """Run the load and measure; the report's `problems` lists every goal missed."""
    out.mkdir(parents=True, exist_ok=True)
    restarts = {m: metric(metrics, "specdec_model_restarts_total", model=m)
                for m in ("draft_model", "target_model")}
    t0 = time.time()
    log = out / "soak_locust.log"
    with Sampler(pid, interval_s) as sampler, open(log, "w") as sink:
        locust = subprocess.Popen(locust_command(http, grpc, out, users, duration_s, max_tokens,
                                                 list(extra)),
                                  cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
        try:
            exit_code = locust.wait(timeout=duration_s + 120)
        except subprocess.TimeoutExpired:   # a problem of its own, reported below
            locust.send_signal(signal.SIGUSR1)   # the locustfile prints where it waits
            time.sleep(5)
            locust.kill()
            exit_code = f"did not stop within {duration_s + 120} s"
    deadline = time.monotonic() + 60   # cancelled and last streams drain
    while time.monotonic() < deadline and metric(metrics, "specdec_active_sequences"):
        time.sleep(1)
    leaked = {m: metric(metrics, "specdec_kv_slots_used", model=m)
              for m in ("draft_model", "target_model")}
    warm = duration_s / 5 if warm_s is None else warm_s   # allocator and cache warm-up
    memory = {}
    for name, points in sorted(sampler.series.items()):
        steady = [(t, v) for t, v in points if t >= warm] or points
        memory[name] = {"samples": len(points), "first_mib": round(points[0][1], 1),
                        "last_mib": round(points[-1][1], 1),
                        "slope_mib_per_min": round(slope_per_min(steady), 3)}
    report = {"started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t0)),
              "duration_s": duration_s, "users": users, "max_tokens": max_tokens,
              "interval_s": interval_s, "locust_exit": exit_code,
              # the locustfile's exit watchdog ended a client teardown that hung (its stacks
              # are in soak_locust.log): the load generator's trouble, not the server's
              "locust_exit_forced": "had not exited" in log.read_text(errors="replace"),
              **request_counts(out), "leaked_slots": leaked,
              "active_sequences_after": metric(metrics, "specdec_active_sequences"),
              "model_restarts": {m: metric(metrics, "specdec_model_restarts_total", model=m) - n
                                 for m, n in restarts.items()},
              "restarted_processes": sorted(sampler.restarted), "memory": memory}
    report["problems"] = problems(report)
    (out / "soak.json").write_text(json.dumps(report, indent=2))
    return report


def problems(r: dict, slope_limit: float = RSS_SLOPE_LIMIT_MIB_PER_MIN,
             engine_slope_limit: float | None = None) -> list[str]:
    """Every goal missed. `engine_slope_limit`: the bound for ENGINE_PROCESSES where a short
    run needs a looser one than the others (default: `slope_limit`)."""
    out = []
    if r["locust_exit"] != 0:
        out.append(f"locust exited {r['locust_exit']} (soak_locust.log)")
    if r["requests"] == 0:
        out.append("no requests were made")
    if r["failures"]:
        out.append(f"{r['failures']} unexpected failures (see soak_failures.csv)")
    if any(r["leaked_slots"].values()) or r["active_sequences_after"]:
        out.append(f"slots still held after the run: {r['leaked_slots']}, "
                   f"active {r['active_sequences_after']}")
    if any(r["model_restarts"].values()) or r["restarted_processes"]:
        out.append(f"server processes restarted: {r['restarted_processes']}")
    for name, m in r["memory"].items():
        limit = slope_limit if name not in ENGINE_PROCESSES else (
            engine_slope_limit if engine_slope_limit is not None else slope_limit)
        if m["slope_mib_per_min"] > limit:
            out.append(f"{name}: memory grows {m['slope_mib_per_min']} MiB/min")
    return out


def markdown(r: dict) -> str:
    lines = [f"Soak {r['started']}: {r['duration_s']} s, {r['users']} users, max_tokens "
             f"{r['max_tokens']}: {r['requests']} requests ({r['cancelled']} cancelled by their "
             f"client), {r['failures']} unexpected failures, slots leaked "
             f"{r['leaked_slots']}"
             + (" (locust's exit hung and was ended by its watchdog)"
                if r.get("locust_exit_forced") else ""), "",
             "| process | samples | first MiB | last MiB | slope MiB/min (after warm-up) |",
             "|---|---|---|---|---|"]
    for name, m in r["memory"].items():
        lines.append(f"| {name} | {m['samples']} | {m['first_mib']} | {m['last_mib']} | "
                     f"{m['slope_mib_per_min']} |")
    lines += ["", "problems: " + ("; ".join(r["problems"]) or "none")]
    return "\n".join(lines)


def parse_duration(text: str) -> float:
    """'90', '90s', '10m', '1h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    return float(text[:-1]) * units[text[-1]] if text[-1] in units else float(text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", default="10m", help="e.g. 60s, 10m")
    ap.add_argument("--users", type=int, default=0,
                    help="concurrent streams; default twice the server's KV slots (saturation)")
    ap.add_argument("--max-sequences", type=int, default=16, help="the server's KV slots")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between RSS samples")
    ap.add_argument("--out", type=Path, default=ROOT / "reports")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from server import Server   # benchmarks/server.py: a tritonserver of our own
    with Server(max_sequences=args.max_sequences) as server:
        report = soak(f"127.0.0.1:{server.http}", server.grpc_url,
                      f"127.0.0.1:{server.metrics_port}", server.proc.pid,
                      int(parse_duration(args.duration)), args.users or 2 * args.max_sequences,
                      args.out, args.interval, args.max_tokens)
    print(markdown(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
