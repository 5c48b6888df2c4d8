"""Rank 0 starts a degree-N target: the shapes and devices checked first, then one worker
process per other rank (parallel_worker), then rank 0's own shard; returns the Leader that the
loop talks to (parallel_engine)."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch

from . import parallel
from ..config import CheckpointError, ModelArgs
from ..in_target import HeadSource
from .parallel_engine import Leader, control_group


def check(path: str | Path, devices: list[torch.device]) -> None:
    """Refuse, before any process starts, shapes that do not divide and devices not present."""
    world = len(devices)
    args = ModelArgs.from_dir(path)
    parallel.layout(args, 0, world, f"{path}/config.json")
    kinds = {d.type for d in devices}
    if len(kinds) > 1:
        raise CheckpointError(f"target devices {', '.join(map(str, devices))}: one kind of device "
                              f"for all ranks, not {sorted(kinds)}")
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        absent = [str(d) for d in cuda if (d.index or 0) >= have]
        if absent:
            raise CheckpointError(f"target devices: {', '.join(absent)} named, {have} CUDA "
                                  f"device(s) visible")
        if len({d.index or 0 for d in cuda}) < len(cuda):
            raise CheckpointError(f"target devices {', '.join(map(str, devices))}: a CUDA device "
                                  f"named twice (one rank per GPU)")


def start(path: str | Path, devices: list[torch.device], engine: dict, dtype: torch.dtype,
          timeout_s: float = 120.0, threads: int = 0, head: HeadSource | None = None) -> Leader:
    """engine: Engine.load's keyword arguments (max_sequences, max_len, vocab_size, ...), the
    same on every rank; head: an EAGLE-3 head's, drafting on rank 0 alone. Collectives fail
    after timeout_s rather than hang."""
    check(path, devices)
    world = len(devices)
    port = _free_port()
    spec = dict(path=str(path), world=world, address="127.0.0.1", port=port,
                devices=[str(d) for d in devices], engine=engine,
                dtype=str(dtype).removeprefix("torch."), timeout_s=timeout_s, threads=threads,
                parent=os.getpid())
    worker = "specdec.runtime.tensor_parallel.parallel_worker"
    workers = [subprocess.Popen([_python(), "-m", worker, json.dumps({**spec, "rank": rank})])
               for rank in range(1, world)]
    try:
        from ..engine import Engine
        tp = parallel.init(0, world, spec["address"], port, devices[0], timeout_s)
        leader = Leader(Engine.load(str(path), dtype=dtype, device=devices[0], tp=tp, head=head,
                                    **engine),
                        control_group(), workers)
    except BaseException:
        for w in workers:
            w.kill()
        parallel.close()
        raise
    return leader


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _python() -> str:
    """This interpreter; inside Triton's Python backend stub (not a python binary), the
    environment's python3 first on PATH."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    return shutil.which("python3") or "python3"
