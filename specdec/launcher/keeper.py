"""Keep tritonserver running: restart it when it dies after it has served, never when it cannot
start.

Triton 2.51 (the only server PyPI installs, in nvidia-pytriton) can crash in its gRPC stream
handling when a client closes a stream at an unlucky moment (docs/reliability.md: server pull
requests 7840, 8078, 8708). Nothing outside the server can close that window, so the launcher
runs tritonserver as its child and starts it again when it dies of a signal or a non-zero exit,
with a backoff that doubles up to a bound and resets after a stable run. While it is down
nothing listens: every probe fails.

A server that dies before it ever became ready is not restarted: that is a configuration or
load error (a missing checkpoint, a port in use), and a restart loop would hide it. Readiness is
Triton's own `/v2/health/ready` on the HTTP port.

A server can also die without exiting: after an abort (a backend process killed while it held a
shared-memory mutex: boost::interprocess::lock_exception, docs/reliability.md) tritonserver
prints its stack and then hangs in its exit, serving nothing. So once ready, the server must
answer `/v2/health/live` (which holds through model reloads, unlike readiness): one that has
not answered for `hung_after_s` is killed, and restarted like one that died.

After each death the launcher kills what the dead server left (its backend processes, which
may hold GPU memory, are in its process group and, orphaned, become the launcher's children:
it is their subreaper) and removes its Python-backend shared-memory regions: each start gets a
prefix of its own (`shm-region-prefix-name`), so only the dead server's files go.

Companions (the OpenAI gateway, `--openai-port`) run beside the server: started with the
keeper, started again after they die (the same backoff, the cause logged), stopped with it.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

SHM_DIR = Path("/dev/shm")
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


@dataclass(frozen=True)
class Backoff:
    first_s: float = 1.0
    max_s: float = 30.0
    stable_s: float = 120.0     # a run this long after ready resets the backoff to first_s
    hung_after_s: float = 30.0  # a ready server that answers no liveness check this long is hung
    check_every_s: float = 2.0  # between liveness checks

    def wait(self, delay: float, ran_s: float) -> float:
        """The wait before a restart: `delay`, or first_s again after a run of stable_s."""
        return self.first_s if ran_s >= self.stable_s else delay

    def grow(self, delay: float) -> float:
        """The next restart's delay after one of `delay`."""
        return min(2 * delay, self.max_s)


def say(message: str) -> None:
    print(f"specdec launch: {message}", file=sys.stderr, flush=True)


def cause(status: int) -> str:
    """A child's exit status (subprocess's convention: -N for signal N) in words."""
    if status < 0:
        try:
            return f"signal {-status} ({signal.Signals(-status).name})"
        except ValueError:
            return f"signal {-status}"
    return f"exit code {status}"


def exit_code(status: int) -> int:
    """What the launcher exits with for a child's status: a shell's 128 + N for signal N."""
    return 128 - status if status < 0 else status


def http_health(address: str, port: int, what: str = "ready") -> Callable[[], bool]:
    """A check of Triton's /v2/health/<what> ("ready" or "live") on the HTTP port."""
    host = "127.0.0.1" if address in ("0.0.0.0", "", "::") else address
    host = f"[{host}]" if ":" in host else host
    url = f"http://{host}:{port}/v2/health/{what}"

    def check() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False
    return check


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):
        pass   # not Linux


def _die_with_parent() -> None:
    """In the child before exec: a launcher killed with SIGKILL still takes its server down
    (gracefully: SIGTERM), since the server is in a process group of its own."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Companion:
    """A process that runs beside the server (the OpenAI gateway): started with the keeper,
    started again after it dies (the same backoff), stopped with it."""

    def __init__(self, name: str, command: list[str], backoff: Backoff):
        self.name, self.command, self.backoff = name, command, backoff
        self.proc: subprocess.Popen | None = None
        self.due = 0.0                      # when to start it (again)
        self.started = 0.0
        self.delay = backoff.first_s

    def tend(self, env: dict[str, str]) -> None:
        if self.proc is None and time.monotonic() >= self.due:
            self.proc = subprocess.Popen(self.command, env=env, start_new_session=True,
                                         preexec_fn=_die_with_parent)
            self.started = time.monotonic()

    def died(self, status: int) -> None:
        ran = time.monotonic() - self.started
        self.delay = self.backoff.wait(self.delay, ran)
        say(f"{self.name} (pid {self.proc.pid}) died with {cause(status)} after {ran:.1f} s; "
            f"restart in {self.delay:.1f} s")
        self.proc, self.due = None, time.monotonic() + self.delay
        self.delay = self.backoff.grow(self.delay)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Keeper:
    """Runs `command(start)` (start = 0, 1, ...) until it exits cleanly or is told to stop, and
    its companions beside it."""

    def __init__(self, command: Callable[[int], list[str]], env: dict[str, str],
                 ready: Callable[[], bool], live: Callable[[], bool],
                 shm_prefix: Callable[[int], str] | None, backoff: Backoff = Backoff(),
                 poll_s: float = 0.5, companions: dict[str, list[str]] | None = None):
        self.command, self.env, self.ready, self.live = command, env, ready, live
        self.shm_prefix, self.backoff, self.poll_s = shm_prefix, backoff, poll_s
        self._answered = self._checked = 0.0   # monotonic times of the liveness checks
        self.stopping: int | None = None     # the signal that asked us to stop
        self.child: subprocess.Popen | None = None
        self.restarts = 0
        self.companions = [Companion(name, cmd, backoff)
                           for name, cmd in (companions or {}).items()]

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = signum
        for proc in [self.child] + [c.proc for c in self.companions]:
            if proc is not None and proc.returncode is None:
                try:
                    os.kill(proc.pid, signum)
                except ProcessLookupError:
                    pass

    def _reap(self) -> int | None:
        """Reap every exited child (orphaned backend processes too); the server's status when it
        is among them."""
        status = None
        while True:
            try:
                pid, raw = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                return status
            if self.child is not None and pid == self.child.pid:
                status = os.waitstatus_to_exitcode(raw)
                self.child.returncode = status
            for c in self.companions:
                if c.proc is not None and pid == c.proc.pid:
                    c.proc.returncode = os.waitstatus_to_exitcode(raw)
                    if self.stopping is None:
                        c.died(c.proc.returncode)

    def _wait(self, until: Callable[[], bool] = lambda: False) -> int | None:
        """Poll until the server exits (its status) or `until()` holds (None)."""
        while True:
            status = self._reap()
            if status is not None:
                return status
            if self.stopping is None:
                for c in self.companions:
                    c.tend(self.env)
                if until():
                    return None
            time.sleep(self.poll_s)

    def _hung(self) -> bool:
        """No liveness check answered for hung_after_s (checked every check_every_s)."""
        now = time.monotonic()
        if now - self._checked >= self.backoff.check_every_s:
            self._checked = now
            if self.live():
                self._answered = time.monotonic()
        return time.monotonic() - self._answered > self.backoff.hung_after_s

    def _sleep(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while self.stopping is None and time.monotonic() < deadline:
            self._reap()
            for c in self.companions:
                c.tend(self.env)
            time.sleep(min(self.poll_s, max(0.0, deadline - time.monotonic())))

    def _clean_up(self, start: int) -> None:
        """Kill what the dead server left in its process group; remove its shared memory."""
        try:
            os.killpg(self.child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._sleep(0.2)
        if self.shm_prefix is not None:
            prefix = self.shm_prefix(start)
            for f in SHM_DIR.glob(prefix + "*"):
                f.unlink(missing_ok=True)

    def run(self) -> int:
        try:
            return self._run()
        finally:
            for c in self.companions:
                c.stop()

    def _run(self) -> int:
        for s in STOP_SIGNALS:
            signal.signal(s, self._on_signal)
        _prctl(PR_SET_CHILD_SUBREAPER, 1)   # orphaned backend processes come to us to reap
        delay, start = self.backoff.first_s, 0
        while True:
            started = time.monotonic()
            # Its own process group: the backend processes it forks stay in it, and one killpg
            # after a crash reaches them all.
            self.child = subprocess.Popen(self.command(start), env=self.env,
                                          start_new_session=True, preexec_fn=_die_with_parent)
            status = self._wait(until=self.ready)
            if status is None:   # ready
                ready_at = time.monotonic()
                say(f"tritonserver (pid {self.child.pid}) ready {ready_at - started:.1f} s after "
                    f"{'its start' if start == 0 else f'restart {start}'}")
                self._answered = self._checked = ready_at
                status = self._wait(until=self._hung)
                if status is None:
                    say(f"tritonserver (pid {self.child.pid}) has answered no liveness check for "
                        f"{self.backoff.hung_after_s:.0f} s: killing it")
                    os.killpg(self.child.pid, signal.SIGKILL)
                    status = self._wait()
            elif self.stopping is None:
                say(f"tritonserver exited with {cause(status)} before it became ready: not "
                    f"restarting (a configuration or load error; its log is above)")
                self._clean_up(start)
                return exit_code(status)
            self._clean_up(start)
            if self.stopping is not None or status == 0:
                return exit_code(status)
            uptime = time.monotonic() - ready_at
            delay = self.backoff.wait(delay, uptime)
            self.restarts += 1
            say(f"tritonserver (pid {self.child.pid}) died with {cause(status)} after "
                f"{uptime:.1f} s of service; restart {self.restarts} in {delay:.1f} s")
            self._sleep(delay)
            if self.stopping is not None:
                return exit_code(-self.stopping)
            delay = self.backoff.grow(delay)
            start += 1
