"""Progress lines on stderr, stamped with the time since the benchmark process started."""
from __future__ import annotations

import sys
import time

T_START = time.monotonic()


def log(msg: str) -> None:
    el = time.monotonic() - T_START
    print(f"[bench {int(el // 60):02d}:{el % 60:04.1f}] {msg}", file=sys.stderr, flush=True)
