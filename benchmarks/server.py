"""A tritonserver of the benchmark's own: start it (any SPECDEC_* settings), read its metrics,
Triton's per-model statistics and its memory, stop it.

    with Server(env={"SPECDEC_SPEC_FULL_BELOW": "64", "SPECDEC_SPEC_OFF_AT": "65"}) as server:
        before = server.metrics()
        ...  # requests to server.grpc_url (clients.run_requests)
        d = settle_metrics(server, before, output_tokens)
        a, per_round = acceptance_rate(d), tokens_per_round(d)
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from inputs import DEFAULT_DRAFT, DEFAULT_TARGET, ROOT
from progress import log

from specdec.launcher import procs

ORCHESTRATOR = "speculative_decoding"   # the `model` label of the specdec_* metrics
DRAFT, TARGET, POSTPROCESSING = "draft_model", "target_model", "postprocessing"
TRITON_PHASES = ("queue", "compute_input", "compute_infer", "compute_output")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_tree(pid: int) -> list[int]:
    """pid and all its descendants (via /proc/<pid>/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo += [int(c) for c in f.read().split()]
        except OSError:
            pass
    return out


def process_cpu_s(pid: int) -> float:
    """User and system CPU seconds a process has used."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu_s(pid: int, name: str) -> float:
    """CPU seconds the threads of a process that the OS knows by `name` have used
    (/proc/<pid>/task/*/schedstat: nanoseconds, finer than stat's clock ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except OSError:   # a thread that ended
            pass
    return total / 1e9


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def default_max_seq_len(target: Path, draft: Path) -> int:
    """The KV slot length the benchmarks give the server: min(1024, max_position_embeddings)."""
    from specdec.runtime.config import ModelArgs
    return min(1024, ModelArgs.from_dir(target).max_position_embeddings,
               ModelArgs.from_dir(draft).max_position_embeddings)


def exit_on_sigterm() -> None:
    """Make a plain `kill` of the benchmark stop its tritonserver too: SIGTERM becomes
    SystemExit, so `with Server(...)` (or a `finally`) runs."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


class Server:
    """A tritonserver of our own (its own process group, ports and backend directory), ready
    when the constructor returns. Only the SPECDEC_* variables given here reach it: the model
    pair, slots and slot length, then `env` (e.g. {"SPECDEC_SPEC_OFF_AT": "65"}) over them.
    The log stays in workdir (a new temporary directory by default). args: more tritonserver
    options (the launcher passes on what it does not know, e.g. --trace-config)."""

    def __init__(self, target: Path = DEFAULT_TARGET, draft: Path = DEFAULT_DRAFT,
                 max_sequences: int = 16, max_seq_len: int | None = None,
                 env: dict[str, str] | None = None, startup_timeout_s: float = 900.0,
                 workdir: Path | None = None, args: tuple[str, ...] = ()):
        if max_seq_len is None:
            max_seq_len = default_max_seq_len(target, draft)
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="specdec-bench-"))
        self.http, self.grpc, self.metrics_port = _free_port(), _free_port(), _free_port()
        self.log_path = self.workdir / "tritonserver.log"
        full = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
        full.update(SPECDEC_TARGET_MODEL=str(target), SPECDEC_DRAFT_MODEL=str(draft),
                    SPECDEC_MAX_SEQUENCES=str(max_sequences), SPECDEC_MAX_SEQ_LEN=str(max_seq_len))
        full.update(env or {})
        self.env = {k: v for k, v in full.items() if k.startswith("SPECDEC_")}
        cmd = [sys.executable, "-m", "specdec.launcher.launch", f"--http-port={self.http}",
               f"--grpc-port={self.grpc}", f"--metrics-port={self.metrics_port}",
               f"--backend-directory={self.workdir / 'backends'}", "--exit-timeout-secs=10",
               *args]
        log(f"starting tritonserver (HTTP {self.http}, gRPC {self.grpc}, metrics "
            f"{self.metrics_port}), log {self.log_path}")
        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=full, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.peak_rss_kb = 0
        self._stop_sampling = threading.Event()
        self._sampler = threading.Thread(target=self._sample_rss, daemon=True)
        self._sampler.start()
        t0 = time.monotonic()
        try:
            while not self._ready():
                if self.proc.poll() is not None or time.monotonic() - t0 > startup_timeout_s:
                    tail = self.log_path.read_text(errors="replace")[-4000:]
                    raise SystemExit(f"tritonserver did not become ready:\n{tail}")
                time.sleep(1)
        except BaseException:
            # Also a SIGTERM (exit_on_sigterm) or ^C while it starts: no caller holds this
            # Server yet to stop it, and its process group, a session of its own, outlives
            # us (a timeout-stopped run left a tritonserver running for an hour, 2026-11-26).
            self.stop()
            raise
        self.startup_s = time.monotonic() - t0
        log(f"tritonserver ready after {self.startup_s:.1f} s")

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def triton_pid(self) -> int | None:
        """tritonserver's pid (the launcher's child; None while the launcher restarts it)."""
        return procs.tritonserver(self.proc.pid)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def _ready(self) -> bool:
        try:
            url = f"http://127.0.0.1:{self.http}/v2/health/ready"
            return urllib.request.urlopen(url, timeout=2).status == 200
        except OSError:
            return False

    def _sample_rss(self) -> None:
        while not self._stop_sampling.is_set():
            rss = sum(_status_kb(p, "VmRSS") for p in _proc_tree(self.proc.pid))
            self.peak_rss_kb = max(self.peak_rss_kb, rss)
            self._stop_sampling.wait(0.5)

    def memory(self) -> dict:
        """Peak RSS of the process tree: sampled sum (every 0.5 s), and the sum of each
        process's own high-water mark (an upper bound: the peaks need not coincide)."""
        tree = _proc_tree(self.proc.pid)
        return {"peak_rss_bytes": self.peak_rss_kb * 1024,
                "sum_of_process_peak_rss_bytes": sum(_status_kb(p, "VmHWM") for p in tree) * 1024,
                "processes": len(tree)}

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds each of the server's processes has used, by model (a backend stub) or
        "tritonserver"; take differences over a run."""
        return {name: process_cpu_s(pid)
                for name, pid in procs.server_processes(self.proc.pid).items()}

    def metrics(self) -> dict[str, float]:
        """Every specdec_* sample of the orchestrator, summed over its other labels."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("specdec_") or f'model="{ORCHESTRATOR}"' not in line:
                continue
            name = line.split("{", 1)[0]
            if name.endswith("_bucket"):
                continue
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """One specdec_* metric of the orchestrator by the value of one label, e.g. a
        histogram's buckets (name_bucket, "le") or a counter's reasons."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(name + "{") and f'model="{ORCHESTRATOR}"' in line:
                value = line.split(f'{label}="', 1)[1].split('"', 1)[0]
                out[value] = out.get(value, 0.0) + float(line.rsplit(" ", 1)[1])
        return out

    def model_stats(self, models: tuple[str, ...] = (DRAFT, TARGET)
                    ) -> dict[str, dict[str, float]]:
        """Triton's own statistics of each model: request count and summed nanoseconds of
        queue, compute_input, compute_infer, compute_output."""
        out = {}
        for model in models:
            url = f"http://127.0.0.1:{self.http}/v2/models/{model}/stats"
            st = json.loads(urllib.request.urlopen(url, timeout=10).read())
            inf = st["model_stats"][0]["inference_stats"]
            out[model] = {"count": float(inf["success"]["count"]),
                          **{key: float(inf[key]["ns"]) for key in TRITON_PHASES}}
        return out

    def batch_stats(self, model: str) -> tuple[dict[int, int], float]:
        """Executions of `model` by the rows the dynamic batcher put in them (Triton's
        batch_stats: how a batch split, where rows per execution only says that it did), and
        the seconds they spent in execute() (compute_infer; with the simulated device, the
        padded call and the Python around it)."""
        url = f"http://127.0.0.1:{self.http}/v2/models/{model}/stats"
        m = json.loads(urllib.request.urlopen(url, timeout=10).read())["model_stats"][0]
        stats = m.get("batch_stats", [])
        return ({int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats},
                sum(float(b["compute_infer"]["ns"]) for b in stats) / 1e9)

    def stop(self) -> None:
        """Stop the process group and remove the backend directory (the log stays)."""
        self._stop_sampling.set()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        if (self.workdir / "backends").exists():
            shutil.rmtree(self.workdir / "backends", ignore_errors=True)
            log("tritonserver stopped")


def metric_delta(before: dict, after: dict) -> dict:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def acceptance_rate(d: dict) -> float | None:
    """a = accepted / drafted draft tokens, from a metric delta (None when nothing was drafted)."""
    drafted = d.get("specdec_draft_tokens_total", 0)
    return d.get("specdec_accepted_tokens_total", 0) / drafted if drafted else None


def tokens_per_round(d: dict) -> float | None:
    """Output tokens per round: the accepted drafts plus the target's own token each round."""
    rounds = d.get("specdec_rounds_total", 0)
    return (d.get("specdec_accepted_tokens_total", 0) + rounds) / rounds if rounds else None


def drafted_per_round(d: dict) -> float | None:
    """The K actually drafted, on average (the server lowers it under load)."""
    rounds = d.get("specdec_rounds_total", 0)
    return d.get("specdec_draft_tokens_total", 0) / rounds if rounds else None


def triton_split(before: dict, after: dict, timed: dict[str, tuple[float, float]]) -> dict:
    """Where the orchestrator's wait for one BLS call goes, per timed call: queue (Triton's
    dynamic batcher), compute (Triton's compute_input + compute_infer + compute_output: the
    stub's execute plus moving request and response between server and stub) and the rest (the
    orchestrator's own request and response handling, the core's routing). timed: model ->
    (seconds summed, calls) as the orchestrator's histograms saw them. Triton's sums also hold
    each request's release call (one per model per request, untimed by the orchestrator), so
    queue and compute are slightly overstated and the rest understated."""
    out = {}
    for model, b in before.items():
        a = after[model]
        total_s, calls = timed.get(model, (0.0, 0.0))
        if not calls:
            continue
        per = {key: (a[key] - b[key]) / calls / 1e9 for key in TRITON_PHASES}
        compute = per["compute_input"] + per["compute_infer"] + per["compute_output"]
        call = total_s / calls
        out[model] = {"calls": int(calls), "triton_requests": int(a["count"] - b["count"]),
                      "call_s": call, "queue_s": per["queue"], "compute_s": compute,
                      "rest_s": call - per["queue"] - compute}
    return out


def settle_metrics(server: Server, before: dict, output_tokens: int) -> dict:
    """Metric deltas once the server has counted every output token the client received."""
    deadline = time.monotonic() + 10
    while True:
        d = metric_delta(before, server.metrics())
        if d.get("specdec_output_tokens_total", 0) >= output_tokens or time.monotonic() > deadline:
            return d
        time.sleep(0.2)
