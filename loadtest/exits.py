"""How the load test's locust leaves once its results are written.

Past its quit event locust only closes its CSV files and calls sys.exit, and the interpreter's
teardown after that (gRPC's core under gevent) hung twice in CI: once waiting for a thread that
never ended, and once where no Python thread could run any more, so that the watchdog thread's
own os._exit never came (a soak's locust killed 120 s past its duration, its results written).
Two guards, each leaving with the run's own exit code:

- `leave`, the last quit listener: closes the CSV files, flushes the output and leaves with
  os._exit, before any teardown;
- `start_watchdog`, from the first quit listener, for a quit listener that hangs: an OS thread
  (not a greenlet: the hub may be what is stuck) that, if the process still lives after the
  limit, prints every greenlet's and thread's stack and leaves.
"""
from __future__ import annotations

import gc
import logging
import os
import sys

import gevent.monkey
import gevent.util


def print_run_info() -> None:
    """Every greenlet's and thread's stack on stderr (what a hung run waits on; also SIGUSR1)."""
    gevent.util.print_run_info(file=sys.stderr)
    sys.stderr.flush()


def start_watchdog(exit_code: int, limit_s: float) -> None:
    real_sleep = gevent.monkey.get_original("time", "sleep")
    start_thread = gevent.monkey.get_original("_thread", "start_new_thread")

    def leave_after(after_s: float) -> None:
        real_sleep(after_s)
        os._exit(exit_code)

    def watchdog() -> None:
        real_sleep(limit_s)
        start_thread(leave_after, (5.0,))   # even if printing blocks
        print(f"loadtest: locust had not exited {limit_s:g} s after writing its "
              f"results; leaving with its exit code {exit_code}. Still running:",
              file=sys.stderr, flush=True)
        print_run_info()
        leave_after(0.0)
    start_thread(watchdog, ())


def leave(exit_code: int) -> None:
    """What locust does after its quit event, less the interpreter's teardown."""
    from locust.stats import StatsCSVFileWriter
    # locust keeps its CSV writer in a local of its main(): found among the live objects.
    for writer in [o for o in gc.get_objects() if isinstance(o, StatsCSVFileWriter)]:
        writer.close_files()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(exit_code)
