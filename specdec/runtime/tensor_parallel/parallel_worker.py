"""Rank r > 0 of a degree-N target: `python -m specdec.runtime.tensor_parallel.parallel_worker
'<json spec>'`, started by rank 0 (parallel_launch.start). It loads its shard, follows rank 0's
calls, and dies with rank 0: the kernel sends it SIGKILL when its parent exits (prctl
PR_SET_PDEATHSIG), and a collective with a dead rank 0 fails at once (gloo) or after the timeout
(NCCL)."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import sys

import torch

from . import parallel
from ..engine import Engine
from .parallel_engine import control_group, follow

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):   # not Linux: the collectives' failures end it instead
        pass
    if os.getppid() != parent:   # rank 0 was gone before the signal was armed
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    spec = json.loads((argv if argv is not None else sys.argv[1:])[0])
    die_with_parent(spec["parent"])
    rank = spec["rank"]
    device = torch.device(spec["devices"][rank])
    if device.type == "cpu" and spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    tp = parallel.init(rank, spec["world"], spec["address"], spec["port"], device,
                       spec["timeout_s"])
    try:
        engine = Engine.load(spec["path"], dtype=getattr(torch, spec["dtype"]), device=device,
                             tp=tp, **spec["engine"])
        follow(engine, control_group(), device)
    finally:
        parallel.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
