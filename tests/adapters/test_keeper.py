"""The launcher's keeper (specdec/launcher/keeper.py) on real processes: a stand-in server that
answers /v2/health/ready and then dies, or never gets ready, or is told to stop. The real
tritonserver under the keeper: tests/e2e/test_disconnect_storm.py."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.conftest import _free_port, wait_for

# argv: port, mode, starts file. Each start appends its pid (and its child's) to the file; the
# child stands for a Python-backend process, left behind if the server dies.
SERVER = textwrap.dedent("""
    import os, signal, subprocess, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    port, mode, starts = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(starts, "a") as f:
        f.write(f"{os.getpid()} {child.pid}\\n")
    n = len(open(starts).read().splitlines())
    if mode == "fail":
        sys.exit(3)
    def stop(signum, frame):
        with open(starts + ".stopped", "a") as f:
            f.write(f"{signum}\\n")
        child.kill()
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    class Ready(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    server = ThreadingHTTPServer(("127.0.0.1", port), Ready)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if mode == "crash" and n <= 3:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGSEGV)
    if mode == "exit" and n == 1:
        time.sleep(0.3)
        os._exit(7)
    if mode == "hang" and n == 1:   # stops answering and never exits, like an abort's hung exit
        time.sleep(0.3)
        server.shutdown()
        server.server_close()
    while True:
        time.sleep(1)
""")

# A companion: records each start, dies (exit 5) the first time, then runs until told to stop.
COMPANION = textwrap.dedent("""
    import os, signal, sys, time
    record = sys.argv[1]
    with open(record, "a") as f:
        f.write(f"start {os.getpid()}\\n")
    if len(open(record).read().splitlines()) == 1:
        time.sleep(0.2)
        sys.exit(5)
    def stop(signum, frame):
        with open(record, "a") as f:
            f.write(f"stopped {signum}\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    while True:
        time.sleep(1)
""")

KEEPER = textwrap.dedent("""
    import sys
    from specdec.launcher.keeper import Backoff, Keeper, http_health
    server, port, mode, starts, prefix, companion = sys.argv[1:7]
    companions = ({"the companion": [sys.executable, companion, starts + ".companion"]}
                  if mode == "companion" else {})
    keeper = Keeper(lambda start: [sys.executable, server, port, mode, starts], {},
                    http_health("127.0.0.1", int(port), "ready"),
                    http_health("127.0.0.1", int(port), "live"), lambda start: f"{prefix}{start}_",
                    Backoff(first_s=0.1, max_s=0.4, stable_s=60, hung_after_s=1.0,
                            check_every_s=0.1), poll_s=0.05, companions=companions)
    sys.exit(keeper.run())
""")


class Run:
    def __init__(self, tmp_path: Path, mode: str):
        self.port = _free_port()
        self.starts = tmp_path / "starts"
        self.prefix = f"specdec_test_{uuid.uuid4().hex[:8]}_"
        (tmp_path / "server.py").write_text(SERVER)
        (tmp_path / "companion.py").write_text(COMPANION)
        self.log = tmp_path / "keeper.log"
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", KEEPER, str(tmp_path / "server.py"), str(self.port), mode,
                 str(self.starts), self.prefix, str(tmp_path / "companion.py")],
                cwd=Path(__file__).resolve().parents[2], stderr=err, start_new_session=True)

    def pids(self) -> list[tuple[int, int]]:
        if not self.starts.exists():
            return []
        return [tuple(map(int, line.split())) for line in self.starts.read_text().splitlines()]

    def wait_starts(self, n: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while len(self.pids()) < n:
            assert self.proc.poll() is None, self.log.read_text()
            assert time.monotonic() < deadline, f"{len(self.pids())} starts, waited for {n}"
            time.sleep(0.05)

    def wait_ready(self, start: int, timeout: float = 30) -> None:
        """Until the keeper has seen start `start` ready (0: the first)."""
        line = "after its start" if start == 0 else f"after restart {start}\n"
        assert wait_for(lambda: line in self.log.read_text(), timeout), self.log.read_text()

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode, self.log.read_text()


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is dead too
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_server_that_dies_after_it_served_is_restarted_with_growing_backoff(tmp_path):
    run = Run(tmp_path, "crash")
    shm = Path("/dev/shm")
    for start in range(3):   # each start's shared memory, as the Python backend names it
        (shm / f"{run.prefix}{start}_region").write_bytes(b"x")
    other = shm / f"{run.prefix}other_region"
    other.write_bytes(b"x")
    try:
        run.wait_ready(3)   # three crashes, then a server that stays up
        for start in range(3):   # removed after each death, only the dead server's
            assert wait_for(lambda: not (shm / f"{run.prefix}{start}_region").exists())
        assert other.exists()
        assert wait_for(lambda: all(not alive(p) for pair in run.pids()[:3] for p in pair)), \
            "a dead server's backend processes outlived it"
        os.killpg(run.proc.pid, signal.SIGTERM)
        code, log = run.finish()
    finally:
        other.unlink(missing_ok=True)
    assert code == 0, log
    deaths = [line for line in log.splitlines() if "died with signal 11 (SIGSEGV)" in line]
    assert len(deaths) == 3, log
    assert [d.rsplit(" in ", 1)[1] for d in deaths] == ["0.1 s", "0.2 s", "0.4 s"], log
    assert all(not alive(p) for p in run.pids()[-1])


def test_a_server_that_never_became_ready_is_not_restarted(tmp_path):
    run = Run(tmp_path, "fail")
    code, log = run.finish()
    assert code == 3 and len(run.pids()) == 1, log
    assert "exit code 3 before it became ready: not restarting" in log


def test_a_non_zero_exit_after_ready_is_restarted(tmp_path):
    run = Run(tmp_path, "exit")
    run.wait_ready(1)
    os.killpg(run.proc.pid, signal.SIGTERM)
    code, log = run.finish()
    assert "died with exit code 7" in log and code == 0, log


def test_a_server_that_stops_answering_is_killed_and_restarted(tmp_path):
    """An abort can leave tritonserver hung in its exit, serving nothing: it is killed once it
    has answered no liveness check for hung_after_s, then restarted like a dead one."""
    run = Run(tmp_path, "hang")
    run.wait_ready(1)
    hung, child = run.pids()[0]
    assert wait_for(lambda: not alive(hung) and not alive(child))
    os.killpg(run.proc.pid, signal.SIGTERM)
    code, log = run.finish()
    assert code == 0, log
    assert "has answered no liveness check for 1 s: killing it" in log, log
    assert "died with signal 9 (SIGKILL)" in log, log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_reaches_the_server_and_nothing_restarts(tmp_path, signum):
    run = Run(tmp_path, "serve")
    run.wait_ready(0)
    run.proc.send_signal(signum)   # the launcher alone, as `docker stop` sends it
    code, log = run.finish()
    assert code == 0 and len(run.pids()) == 1, log
    assert (tmp_path / "starts.stopped").read_text().split() == [str(int(signum))]


def test_a_killed_launcher_takes_its_server_down(tmp_path):
    run = Run(tmp_path, "serve")
    run.wait_ready(0)
    server, _ = run.pids()[0]
    run.proc.kill()
    run.proc.wait()
    assert wait_for(lambda: not alive(server)), "the server outlived its launcher"
    assert (tmp_path / "starts.stopped").read_text().split() == [str(int(signal.SIGTERM))]


def test_a_companion_is_restarted_when_it_dies_and_stopped_with_the_server(tmp_path):
    """The OpenAI gateway beside the server (--openai-port): kept alive, stopped on SIGTERM."""
    run = Run(tmp_path, "companion")
    record = tmp_path / "starts.companion"
    run.wait_ready(0)
    assert wait_for(lambda: record.exists() and record.read_text().count("start") == 2)
    os.killpg(run.proc.pid, signal.SIGTERM)
    code, log = run.finish()
    assert code == 0, log
    assert "the companion (pid" in log and "died with exit code 5" in log, log
    assert wait_for(lambda: record.read_text().splitlines()[-1] == f"stopped {int(signal.SIGTERM)}")
    assert len(run.pids()) == 1   # the server itself was never restarted
