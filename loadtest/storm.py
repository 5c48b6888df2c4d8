"""Disconnect storm: gRPC clients that close short streams abruptly, on a server of its own under
the launcher; how often tritonserver crashes and how soon it serves exact output again.

    python -m loadtest.storm --duration 5m --threads 8 --header always   (make storm)

Triton 2.51, the server nvidia-pytriton installs, can crash in its gRPC stream handling when a
client goes away at an unlucky moment (docs/reliability.md). Each client thread loops over
streams of its own (one channel each) and ends every stream one of these ways, at random:

    cancel-mid    cancel after 1 to 3 responses (stop_stream(cancel_requests=True))
    after-error   send an invalid request; cut the stream the moment the error arrives
    after-first   cut the stream right after its first response
    clean         read to the final response and half-close (the control)

`--header` decides which streams ask for the `triton_grpc_error` mode (its status codes come
with a use-after-free before Triton 2.68): always, never, or half of them. Every request must
end within `--timeout`: with its responses, an error, or a refused connection while the server
restarts. A request that does not is a hang, and a failure.

A monitor watches the launcher's tritonserver: a new pid (or none) is a crash, whose cause the
launcher logs; after each crash it asks for a greedy generation until the answer equals the
reference taken before the storm, which is the time back to exact service. After the storm it
waits for exact service once more (`--recovery-bound`), then checks that no KV slot is held.
"""
from __future__ import annotations

import argparse
import json
import queue
import random
import re
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.soak import metric, parse_duration
from specdec.launcher import procs
from specdec_client import GenerationParams, ServerError, generate

ROOT = Path(__file__).resolve().parents[1]
ENDINGS = ("cancel-mid", "after-error", "after-first", "clean")
HEADERS = ("always", "never", "half")
_DIED = re.compile(r"tritonserver \(pid (\d+)\) died with (.+?) after")


def greedy(max_tokens: int) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, temperature=0.0)


def one_stream(address: str, prompt: str, ending: str, header: bool, timeout: float,
               rng: random.Random) -> tuple[str, bool]:
    """One request ended the `ending` way: (outcome, whether the client cut a live stream).
    outcome: answered, error, cancelled or hang."""
    from tritonclient.grpc import InferenceServerClient
    from tritonclient.utils import InferenceServerException

    from specdec_client.grpc_transport import (STATUS_HEADERS, build_infer_inputs, close_stream,
                                               input_ranks)
    params = (GenerationParams(max_tokens=100000) if ending == "after-error"
              else greedy(rng.randint(4, 32)))
    answers: queue.Queue = queue.Queue()
    client = InferenceServerClient(address)
    cut, outcome = False, "hang"
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)),
                            headers=STATUS_HEADERS if header else None)
        client.async_stream_infer("ensemble", build_infer_inputs(
            prompt, params, ranks=input_ranks(client, address, "ensemble", timeout)),
            enable_empty_final_response=True)
        stop_after = rng.randint(1, 3)
        responses = 0
        while True:
            try:
                result, error = answers.get(timeout=timeout)
            except queue.Empty:
                break   # a hang: the finally cuts it
            if error is not None:
                outcome, cut = "error", ending == "after-error"
                break
            responses += 1
            params_ = result.get_response().parameters
            final = ("triton_final_response" in params_
                     and params_["triton_final_response"].bool_param)
            if final:
                outcome = "answered"
                break
            if ending == "after-first" or (ending == "cancel-mid" and responses >= stop_after):
                outcome, cut = ("answered" if ending == "after-first" else "cancelled"), True
                break
    except InferenceServerException:
        outcome = "error"   # the stream could not start: the server is down
    finally:
        try:
            close_stream(client, cancel=cut or outcome == "hang", grace_s=timeout)
        except Exception:
            pass
        client.close()
    return outcome, cut


@dataclass
class Tally:
    streams: Counter = field(default_factory=Counter)     # (ending, header, outcome) -> n
    cuts: int = 0                                         # abrupt closes of live streams
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ending: str, header: bool, outcome: str, cut: bool) -> None:
        with self.lock:
            self.streams[(ending, "header" if header else "plain", outcome)] += 1
            self.cuts += cut


class Monitor:
    """Crashes of the launcher's tritonserver and the time from each to exact service."""

    def __init__(self, launcher: int, http: str, prompt: str, reference: str, max_tokens: int):
        self.launcher, self.http, self.prompt = launcher, http, prompt
        self.reference, self.max_tokens = reference, max_tokens
        self.crashes: list[dict] = []
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def exact(self) -> bool:
        try:
            return generate(self.http, self.prompt, greedy(self.max_tokens),
                            timeout=30).text == self.reference
        except (ServerError, OSError):
            return False

    def _run(self) -> None:
        pid = procs.tritonserver(self.launcher)
        crash = None
        while not self._stop.wait(0.2):
            now = procs.tritonserver(self.launcher)
            if now != pid:
                if pid is not None:   # the one we knew is gone
                    crash = {"at_s": round(time.monotonic() - self.t0, 1), "pid": pid}
                    self.crashes.append(crash)
                pid = now
            if crash is not None and "back_s" not in crash and now is not None and self.exact():
                crash["back_s"] = round(time.monotonic() - self.t0 - crash["at_s"], 1)

    def __enter__(self) -> "Monitor":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def wait_for_exact(monitor: Monitor, bound_s: float) -> float | None:
    """Seconds until the server gives the reference again, None past the bound."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < bound_s:
        if procs.tritonserver(monitor.launcher) is not None and monitor.exact():
            return round(time.monotonic() - t0, 1)
        time.sleep(0.5)
    return None


def causes(log: Path) -> dict[int, str]:
    """pid -> how the launcher says it died."""
    text = log.read_text(errors="replace") if log.exists() else ""
    return {int(m.group(1)): m.group(2) for m in _DIED.finditer(text)}


def storm(http: str, grpc: str, metrics: str, launcher: int, log: Path, duration_s: float,
          threads: int, header: str = "half", timeout: float = 60.0, seed: int = 0,
          recovery_bound_s: float = 300.0, max_tokens: int = 16,
          endings: tuple[str, ...] = ENDINGS) -> dict:
    """Run the storm against a launcher's server; the report's `problems` lists what failed."""
    from loadtest.prompts import load_prompts
    prompts = load_prompts(None, 16, 300)
    reference = generate(http, prompts[0], greedy(max_tokens)).text
    tally = Tally()
    deadline = time.monotonic() + duration_s

    def client(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        while time.monotonic() < deadline:
            ending = rng.choice(endings)
            with_header = {"always": True, "never": False}.get(header, rng.random() < 0.5)
            outcome, cut = one_stream(grpc, rng.choice(prompts), ending, with_header, timeout,
                                      rng)
            tally.add(ending, with_header, outcome, cut)
            if outcome == "error" and ending != "after-error":
                time.sleep(0.2)   # the server is down or full: do not spin

    with Monitor(launcher, http, prompts[0], reference, max_tokens) as monitor:
        workers = [threading.Thread(target=client, args=(i,), daemon=True)
                   for i in range(threads)]
        for w in workers:
            w.start()
        for w in workers:   # each stream is bounded by its timeout (and close_stream's grace)
            w.join(duration_s + 3 * timeout + 60)
        stuck = sum(w.is_alive() for w in workers)
        back_after_s = wait_for_exact(monitor, recovery_bound_s)
    said = causes(log)
    for c in monitor.crashes:
        c["cause"] = said.get(c["pid"], "unknown")
    held = None
    if back_after_s is not None:   # cancelled sequences are released within a moment
        for _ in range(60):
            held = {m: metric(metrics, "specdec_kv_slots_used", model=m)
                    for m in ("draft_model", "target_model")}
            if not any(held.values()):
                break
            time.sleep(0.5)
    streams = sum(tally.streams.values())
    hangs = sum(n for (_, _, o), n in tally.streams.items() if o == "hang")
    report = {
        "duration_s": duration_s, "threads": threads, "header": header, "timeout_s": timeout,
        "endings": list(endings),
        "streams": streams, "abrupt_disconnects": tally.cuts, "hangs": hangs,
        "stuck_threads": stuck, "crashes": monitor.crashes,
        "crashes_per_1000_abrupt": round(1000 * len(monitor.crashes) / max(tally.cuts, 1), 2),
        "exact_again_after_storm_s": back_after_s, "slots_held_after": held,
        "by_ending": {f"{e} {h} {o}": n for (e, h, o), n in sorted(tally.streams.items())},
    }
    report["problems"] = problems(report, recovery_bound_s)
    return report


def problems(r: dict, recovery_bound_s: float) -> list[str]:
    out = []
    if r["hangs"] or r["stuck_threads"]:
        out.append(f"{r['hangs']} requests hung, {r['stuck_threads']} client threads stuck")
    if r["exact_again_after_storm_s"] is None:
        out.append(f"no exact output within {recovery_bound_s} s after the storm")
    elif any(r["slots_held_after"].values()):
        out.append(f"KV slots still held after the storm: {r['slots_held_after']}")
    return out


def markdown(r: dict) -> str:
    crashes = ", ".join(f"{c['cause']} at {c['at_s']} s (exact again after "
                        f"{c.get('back_s', '-')} s)" for c in r["crashes"]) or "none"
    # A crash without back_s was followed by another (or the end) before the monitor saw exact
    # output.
    return "\n".join([
        f"Storm: {r['duration_s']} s, {r['threads']} threads, header {r['header']}, endings "
        f"{','.join(r['endings'])}: "
        f"{r['streams']} streams, {r['abrupt_disconnects']} abrupt disconnects, "
        f"{len(r['crashes'])} crashes ({r['crashes_per_1000_abrupt']} per 1000 abrupt), "
        f"{r['hangs']} hangs; exact output {r['exact_again_after_storm_s']} s after the storm",
        f"crashes: {crashes}",
        "streams by ending: " + ", ".join(f"{k}: {n}" for k, n in r["by_ending"].items()),
        "problems: " + ("; ".join(r["problems"]) or "none")])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", default="60s", help="e.g. 60s, 5m")
    ap.add_argument("--threads", type=int, default=8, help="concurrent client threads")
    ap.add_argument("--header", choices=HEADERS, default="half",
                    help="streams that ask for the triton_grpc_error mode. Default half")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds a request may wait for a response before it is a hang")
    ap.add_argument("--recovery-bound", type=float, default=300.0,
                    help="seconds exact service may take to come back after the storm")
    ap.add_argument("--endings", default=",".join(ENDINGS),
                    help=f"comma-separated ways to end a stream, drawn at random. Default: all "
                         f"({','.join(ENDINGS)}); clean alone is how the project's clients end")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=ROOT / "reports")
    args = ap.parse_args(argv)
    endings = tuple(args.endings.split(","))
    if not endings or set(endings) - set(ENDINGS):
        ap.error(f"--endings: choose from {','.join(ENDINGS)}")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from server import Server   # benchmarks/server.py: a tritonserver of our own
    with Server() as server:
        report = storm(f"127.0.0.1:{server.http}", server.grpc_url,
                       f"127.0.0.1:{server.metrics_port}", server.proc.pid, server.log_path,
                       parse_duration(args.duration), args.threads, args.header, args.timeout,
                       args.seed, args.recovery_bound, endings=endings)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"storm-{args.header}-{'-'.join(endings)}.json"
    (args.out / name).write_text(json.dumps(report, indent=2))
    print(markdown(report))
    return 1 if report["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
