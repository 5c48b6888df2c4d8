"""py-spy beside a benchmark's measured runs: each run's processes sampled while it lasts, as
py-spy's raw (folded) stacks, one file a process (`--py-spy BIN`). On a GPU host the engine's
calls leave the cores idle, and what a round's Python does is what a served token waits on.

    .venv/bin/python benchmarks/pyspy.py DIR        # the top functions of every file in DIR
"""
from __future__ import annotations

import collections
import contextlib
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from progress import log


class Profiler:
    def __init__(self, binary: str | None, out_dir: Path | None, rate: int = 100):
        self.binary, self.out_dir, self.rate = binary, out_dir, rate

    @contextlib.contextmanager
    def record(self, run: str, pids: dict[str, int]):
        """Samples pids ({name: pid}) until the block ends, into out_dir/<run>--<name>.txt."""
        if not self.binary:
            yield
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        run = re.sub(r"[^A-Za-z0-9=.-]+", "_", run)
        with contextlib.ExitStack() as logs:
            spies = []
            for name, pid in pids.items():
                out = self.out_dir / f"{run}--{name}.txt"
                spies.append(subprocess.Popen(
                    [self.binary, "record", "-p", str(pid), "-r", str(self.rate), "-f", "raw",
                     "-o", str(out), "--nonblocking"],
                    stdout=subprocess.DEVNULL,
                    stderr=logs.enter_context(open(f"{out}.log", "w"))))
            time.sleep(0.5)   # attached before the run starts
            try:
                yield
            finally:
                for spy in spies:   # py-spy writes its file on ^C
                    spy.send_signal(signal.SIGINT)
                for spy in spies:
                    try:
                        spy.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        spy.kill()
                        log(f"py-spy {spy.args[3]} did not stop")


def top(path: Path, n: int = 15) -> str:
    """A raw file's samples by the innermost frame, and by the specdec frame nearest it."""
    own, ours, total = collections.Counter(), collections.Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames, c = stack.split(";"), int(count)
        total += c
        own[frames[-1]] += c
        mine = [f for f in frames if "specdec" in f or "benchmarks" in f]
        ours[mine[-1] if mine else "(other)"] += c
    lines = [f"{path.name}: {total} samples"]
    for title, counts in (("innermost frame", own), ("nearest specdec frame", ours)):
        lines.append(f"  by {title}:")
        lines += [f"    {100 * c / max(total, 1):5.1f} %  {f}" for f, c in counts.most_common(n)]
    return "\n".join(lines)


if __name__ == "__main__":
    for p in sorted(Path(sys.argv[1]).glob("*.txt")):
        print(top(p))
