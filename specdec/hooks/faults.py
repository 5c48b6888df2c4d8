"""Fault injection for the end-to-end tests: a setting, never a code patch.

`$SPECDEC_DRAFT_FAULT` (or `_TARGET_`; config.pbtxt parameter `fault`) is a script of steps,
each applied to that many successive calls (proposals or verifications; releases are never
faulty), then the model behaves:

    error*2,delay=3*1,unavailable*2    two calls fail (INTERNAL), one answers after 3 s, two
                                       answer UNAVAILABLE, the rest are normal
    error                              every call fails (a step without a count never ends)

Read once at load. Tests only: the default is no fault, and a spec that does not parse fails
the load. A script runs in a model's first process on a server (`first_process`): one the
supervisor restarts starts clean, as after a real crash.
"""
from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

_STEP = re.compile(r"(error|unavailable|delay=(?P<seconds>[0-9.]+))(\*(?P<count>\d+))?")


class InjectedFault(RuntimeError):
    def __init__(self, message: str, unavailable: bool):
        super().__init__(message)
        self.unavailable = unavailable


@dataclass(frozen=True)
class Step:
    kind: str              # "error", "unavailable" or "delay"
    seconds: float = 0.0   # delay
    count: int = 0         # calls it applies to; 0: every call from here on


def parse(spec: str) -> list[Step]:
    steps = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        m = _STEP.fullmatch(part)
        if m is None:
            raise ValueError(f"fault step {part!r}: expected error, unavailable or delay=<s>, "
                             f"each with an optional *<count>")
        kind = "delay" if m["seconds"] else m[1]
        steps.append(Step(kind, float(m["seconds"] or 0), int(m["count"] or 0)))
    return steps


def first_process(steps: list[Step], model: str, server: str | None = None,
                  markers: str | None = None) -> list[Step]:
    """steps in `model`'s first process on this server, none in a process that replaces it: a
    restarted model that failed by script again would make a restart test time the script's
    backoffs, not the recovery. A marker file per server (default: the stub's parent,
    tritonserver, by pid and start time) and model in markers (the temporary directory) says
    the script has run."""
    if not steps:
        return steps
    marker = Path(markers or tempfile.gettempdir()) / \
        f"specdec-fault-{server or _process_id(os.getppid())}-{model}"
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return []
    return steps


def _process_id(pid: int) -> str:
    """pid and start time: a pid alone is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return f"{pid}.{stat.rsplit(')', 1)[1].split()[19]}"   # field 22, starttime
    except OSError:
        return str(pid)


class Injector:
    """One model's script; `before(n)` runs ahead of a batch of n calls."""

    def __init__(self, steps: list[Step], sleep=time.sleep):
        self.steps, self.sleep, self.calls = steps, sleep, 0

    def _step(self, call: int) -> Step | None:
        end = 0
        for step in self.steps:
            if step.count == 0:
                return step
            end += step.count
            if call < end:
                return step
        return None

    def before(self, n: int) -> list[Exception | None]:
        """Each of the next n calls' injected error (None: run it); sleeps for delays."""
        out, delay = [], 0.0
        for _ in range(n):
            step = self._step(self.calls)
            self.calls += 1
            if step is not None and step.kind == "delay":
                delay = max(delay, step.seconds)
            out.append(None if step is None or step.kind == "delay" else InjectedFault(
                f"injected fault: {step.kind}", step.kind == "unavailable"))
        if delay:
            self.sleep(delay)
        return out


class FailingDrafter:
    """An in-target drafter (in_target.py) whose draft() raises what fault() returns, or
    drafts: a drafter failing in a verification that stands. Attached from outside the engine
    (fail_drafters), everything else the drafter's own."""

    def __init__(self, drafter, fault):
        self.drafter, self.fault = drafter, fault

    def __getattr__(self, name: str):
        return getattr(self.drafter, name)

    def draft(self, v):
        error = self.fault()
        if error is not None:
            raise error
        return self.drafter.draft(v)


def fail_drafters(engine, fault) -> None:
    """Every drafter in the engine's process fails when fault() returns an exception."""
    for kind, drafter in engine.drafters.items():
        engine.drafters[kind] = FailingDrafter(drafter, fault)
