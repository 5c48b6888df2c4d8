"""Tensors that cross the Python backend's boundary by DLPack, on whatever device they are.

Only the engines' processes (draft_model, target_model) use these; the rest of the serving glue
(adapter.py) stays free of torch.
"""
from __future__ import annotations

import torch


def read_torch(pb, request, name: str) -> torch.Tensor | None:
    """An input as a torch tensor on whatever device it arrived on (DLPack, no copy)."""
    t = pb.get_input_tensor_by_name(request, name)
    return None if t is None else torch.from_dlpack(t.to_dlpack())


def torch_output(pb, name: str, t: torch.Tensor):
    return pb.Tensor.from_dlpack(name, torch.utils.dlpack.to_dlpack(t.contiguous()))
