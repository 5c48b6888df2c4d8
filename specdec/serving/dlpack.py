"""Tensors that cross the Python backend's boundary by DLPack, on whatever device they are.

Only the engines' processes (draft_model, target_model, or speculative_decoding hosting the
target) use these; the rest of the serving glue (adapter.py) stays free of torch.
"""
from __future__ import annotations

import torch


def as_torch(t) -> torch.Tensor:
    """A Triton tensor as a torch tensor on whatever device it is on (DLPack, no copy)."""
    return torch.from_dlpack(t.to_dlpack())


def read_torch(pb, request, name: str) -> torch.Tensor | None:
    """An input as a torch tensor (as_torch)."""
    t = pb.get_input_tensor_by_name(request, name)
    return None if t is None else as_torch(t)


def torch_output(pb, name: str, t: torch.Tensor):
    return pb.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(t.contiguous()))
