"""What a benchmark ran on, recorded with its figures: the machine, the commit, package versions,
and the load from others at start and end (other tritonservers share the CPU/GPU)."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from inputs import ROOT


def machine() -> dict:
    import torch
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cpu_count": os.cpu_count(),
            "cpu_affinity": (len(os.sched_getaffinity(0))
                             if hasattr(os, "sched_getaffinity") else None),
            "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
            "python": platform.python_version()}
    try:
        info["memory_bytes"] = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        pass
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info


def git_state() -> dict:
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD"),
            "modified_tracked_files": status.splitlines() if status else []}


def versions() -> dict:
    import importlib.metadata as md
    out = {}
    for pkg in ("torch", "transformers", "tokenizers", "nvidia-pytriton", "tritonclient"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = None
    return out


def other_tritonservers(own: int | None = None) -> int:
    """tritonserver processes on this machine that are not ours (they share the CPU/GPU)."""
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == own:
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                n += f.read().strip() == "tritonserver"
        except OSError:
            pass
    return n


def load_snapshot(own: int | None = None) -> dict:
    return {"loadavg_1_5_15": list(os.getloadavg()),
            "other_tritonserver_processes": other_tritonservers(own)}


def write_result(path: Path, **fields) -> None:
    """A result's JSON: the command, the machine and the commit, then `fields`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": sys.argv, "machine": machine(), "git": git_state(),
                                **fields}, indent=1))
