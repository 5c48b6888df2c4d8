"""draft_model's and target_model's settings (EngineSettings), parsed once at load like the
rest of settings.py, and the device checks a load runs on them."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .settings import _DTYPES, ENV_PREFIX, NO_DRAFT, SettingsError, _parse, model_paths

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EngineSettings:
    """draft_model / target_model."""
    model_path: str = ""
    target_model_path: str = ""   # the draft reads the target's vocabulary size from it
    max_sequences: int = 16       # KV slots: concurrent sequences
    max_seq_len: int = 1024       # tokens per slot: prompt + output + draft lookahead
    dtype: str = "auto"           # auto: bfloat16 on CUDA, float32 on the CPU
    device: str = "auto"          # auto: cuda when available
    cpu_threads: int = 0          # torch threads on the CPU; 0: half the cores (two models)
    kernel_threads: int = 0       # the CPU kernels' threads (specdec/kernels/cpu); 0: every core
    cpu_kernels: str = "auto"     # auto: the CPU's own kernels where they build; on: required; off
    attention: str = "auto"       # auto: flash-attn on CUDA when installed, else SDPA; sdpa; flash
    cuda_graphs: bool = True      # replay small forwards from CUDA graphs (CUDA only)
    # CUDA: the layers' norms and SiLU x up by Triton kernels (gpu_pointwise.py); off until a
    # GPU measures it (benchmarks/gpu_checklist.sh profile times both)
    fused_pointwise: bool = False
    fault: str = ""               # tests only: a fault script (faults.py); $SPECDEC_<ROLE>_FAULT
    eagle_head_path: str = ""     # target: an EAGLE-3 head drafting in its process; $SPECDEC_EAGLE_HEAD
    in_target_fault: str = ""     # tests only: its in-target drafter's fault script
    tokenizer_path: str = ""      # the served tokenizer: the draft's own is checked against it
    # target: score every token with the same arithmetic whatever its batch
    # (specdec/kernels/invariant.py); auto: on in 16-bit dtypes, where near-ties flip. The draft's
    # arithmetic never changes output.
    batch_invariant: str = "auto"
    # target: ranks of tensor parallelism (specdec/runtime/tensor_parallel/parallel.py);
    # target_devices: one device per rank, comma-separated (cuda:0,cuda:1); given alone, its count
    # is the degree. The draft ignores both: it runs on `device`.
    tensor_parallel: int = 1
    target_devices: str = ""
    # draft: its own device (cpu, cuda, cuda:N), which overrides `device` for the draft; empty:
    # the target's first device (target_devices' first, else `device`). The target ignores it.
    draft_device: str = ""

    @classmethod
    def parse(cls, params: dict, role: str) -> "EngineSettings":
        """role: "target" or "draft"; paths from model_paths ($SPECDEC_TARGET_MODEL, ...)."""
        s = _parse(cls, params, {"fault": f"{ENV_PREFIX}{role.upper()}_FAULT"},
                   skip=("model_path", "target_model_path", "eagle_head_path", "tokenizer_path"))
        if "model_path" in params:   # this model's own checkpoint, as the adapter tests hand it
            params = {f"{role}_model_path": params["model_path"], **params}
        paths = model_paths(params)
        path, target = (paths.target if role == "target" else paths.draft), paths.target
        if path == NO_DRAFT and role != "draft":
            raise SettingsError(f"the {role} model cannot be {NO_DRAFT!r}")
        if s.dtype not in ("auto", *_DTYPES):
            raise SettingsError(f"dtype {s.dtype!r}: expected auto or one of {', '.join(_DTYPES)}")
        if s.max_sequences < 1 or s.max_seq_len < 2:
            raise SettingsError("max_sequences must be >= 1 and max_seq_len >= 2")
        if s.cpu_kernels not in ("auto", "on", "off"):
            raise SettingsError(f"cpu_kernels {s.cpu_kernels!r}: expected auto, on or off")
        if s.attention not in ("auto", "sdpa", "flash"):
            raise SettingsError(f"attention {s.attention!r}: expected auto, sdpa or flash")
        if s.batch_invariant not in ("auto", "on", "off"):
            raise SettingsError(f"batch_invariant {s.batch_invariant!r}: expected auto, on or off")
        for name in ("fault", "in_target_fault"):
            if not getattr(s, name):
                continue
            from ..hooks import faults   # tests only: not imported unless asked
            try:
                faults.parse(getattr(s, name))
            except ValueError as e:
                raise SettingsError(f"{name} {getattr(s, name)!r}: {e}") from None
        head = paths.head if role == "target" else ""
        degree, devices = (_placement(s.tensor_parallel, s.target_devices) if role == "target"
                           else (1, ""))
        device, draft_device = s.device, ""
        if role == "draft":
            draft_device = _draft_device(s.draft_device)
            device = draft_device or s.target_devices.split(",")[0].strip() or s.device
        if s.kernel_threads < 0:
            raise SettingsError(f"kernel_threads {s.kernel_threads}: expected 0 (every core) "
                                f"or more")
        return cls(path, target, s.max_sequences, s.max_seq_len, s.dtype, device, s.cpu_threads,
                   s.kernel_threads, s.cpu_kernels, s.attention, s.cuda_graphs,
                   s.fused_pointwise, s.fault, head,
                   s.in_target_fault, paths.tokenizer, s.batch_invariant, degree, devices,
                   draft_device)

    @property
    def disabled(self) -> bool:
        """A draft_model configured with no draft: it loads nothing and answers nothing."""
        return self.model_path == NO_DRAFT

    def torch_device(self) -> torch.device:
        import torch
        if self.device == "auto":
            return torch.device("cuda" if torch.cuda.is_available() else "cpu")
        return torch.device(self.device)

    def device_source(self, role: str) -> str:
        """The setting that named this model's (rank 0's) device, for a refusal at load."""
        if role == "draft":
            return "draft_device" if self.draft_device else "device"
        return "target_devices" if self.target_devices else "device"

    def threads(self) -> int:
        """Draft and target alternate within a sequence and overlap across sequences: each gets
        half the cores. Measured on 2 vCPUs, default pair: a target step takes 4.3 ms with one
        thread, 27 ms with two spinning OpenMP threads, 4.9 ms with two passive ones."""
        return self.cpu_threads or max(1, (os.cpu_count() or 2) // 2)

    @property
    def cpu_kernel(self) -> bool | None:
        """Engine's cpu_kernel for cpu_kernels: None (where they build), True or False."""
        return {"auto": None, "on": True, "off": False}[self.cpu_kernels]

    def kernel_thread_count(self) -> int:
        """The CPU kernels' threads. Every core this process may run on by default: a kernel call's
        items go to whichever of its threads is running (specdec/kernels/cpu/pool.c), so a core busy
        with the server's other processes costs no wait. Measured on 2 vCPUs, smollm2-135m in
        float32: a 16-row step 70 ms with one, 44 with two."""
        if self.kernel_threads:
            return self.kernel_threads
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
            os.cpu_count() or 1

    def invariant(self, role: str, dtype: torch.dtype) -> bool:
        """Whether this model computes batch-invariantly: the target, in 16-bit dtypes unless
        set. Measured on the CPU (docs/exactness.md): float32 rarely flips a token and costs
        its blocked matmuls; bfloat16 flipped 3-6 of 16 prompts and costs little."""
        import torch
        if role != "target" or self.batch_invariant == "off":
            return False
        return self.batch_invariant == "on" or dtype in (torch.bfloat16, torch.float16)

    def rank_devices(self) -> list[torch.device]:
        """One device per tensor-parallel rank, rank 0 first: target_devices, else `device`
        (auto: cuda) for one rank, cuda:0 .. cuda:N-1 (or the CPU N times) for N."""
        import torch
        if self.target_devices:
            return [torch.device(d) for d in self.target_devices.split(",")]
        device = self.torch_device()
        if self.tensor_parallel == 1:
            return [device]
        if device.type == "cuda":
            return [torch.device("cuda", i) for i in range(self.tensor_parallel)]
        return [device] * self.tensor_parallel

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            # Not at import: preprocessing loads no model.
            from ..runtime.engine import default_dtype
            return default_dtype(self.torch_device())
        import torch
        return getattr(torch, self.dtype)


def _placement(degree: int, devices: str) -> tuple[int, str]:
    """(tensor_parallel, target_devices) checked: the count of devices is the degree."""
    names = [d.strip() for d in devices.split(",") if d.strip()]
    if degree < 1:
        raise SettingsError(f"tensor_parallel {degree}: expected 1 or more ranks")
    if names and degree not in (1, len(names)):
        raise SettingsError(f"tensor_parallel {degree} but target_devices {devices!r} names "
                            f"{len(names)} device(s): one device per rank")
    for name in names:
        if name != "cpu" and not (name.startswith("cuda:") and name[5:].isdigit()):
            raise SettingsError(f"target_devices {devices!r}: {name!r} is neither cpu nor cuda:N")
    return (len(names) or degree), ",".join(names)


def _draft_device(raw: str) -> str:
    """draft_device checked: cpu, cuda or cuda:N; "" (or auto): the target's first device."""
    name = raw.strip()
    if name in ("", "auto"):
        return ""
    if name in ("cpu", "cuda") or (name.startswith("cuda:") and name[5:].isdigit()):
        return name
    raise SettingsError(f"draft_device {raw!r}: expected cpu, cuda or cuda:N (empty: the "
                        f"target's first device)")


def check_device(device: torch.device, source: str) -> None:
    """Refuse at load a device this machine lacks, naming the setting and its value."""
    import torch
    name = str(device)
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise SettingsError(f"{source} {name!r}: expected cpu, cuda or cuda:N")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not have:
        raise SettingsError(f"{source} {name!r}: no CUDA device on this machine")
    if (device.index or 0) >= have:
        raise SettingsError(f"{source} {name!r}: {have} CUDA device(s) visible "
                            f"(cuda:0 .. cuda:{have - 1})")
