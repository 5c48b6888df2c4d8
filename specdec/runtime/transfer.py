"""Host values onto the device without waiting for it.

`torch.tensor(values, device="cuda")` copies with a stream synchronization: made after a forward
was launched, it holds the host until the forward ends, and every kernel launched after it
starts only then (the GPU idles while the host launches them). An H100's in-process round spent
82 % of its host samples in one such wait (docs/benchmarks.md, "Served on a GPU: NVIDIA H100").
Copied without blocking, the values are staged by the driver and the copy queues behind the
forward like any kernel.
"""
from __future__ import annotations

import torch


def to_device(values, device: torch.device, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """values (a list, nested or flat) as a tensor on device, queued, not waited for."""
    return torch.tensor(values, dtype=dtype).to(device, non_blocking=True)
