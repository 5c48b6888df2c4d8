"""What a model needs and a device has: a model's weight bytes (counted on the meta device), the
memory free on a GPU or in RAM, and the check at load that refuses weights and a KV slot pool
the device cannot hold, before any weight loads."""
from __future__ import annotations

import os

import torch

from .config import CheckpointError, ModelArgs
from ..kernels.cpu import linear as cpu_linear
from .kv_cache import KVCache
from .model import Transformer, on_meta, vocab_rows
from .tensor_parallel.parallel import Shard, layout, local_args


def weight_bytes(args: ModelArgs, dtype: torch.dtype, tp: Shard | None = None) -> int:
    """The bytes of a model's weights in `dtype` (a rank's: args its local_args, tp its Shard),
    counted on the meta device: no memory."""
    with on_meta():
        model = Transformer(args, tp)
    model.tie_weights()
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


def check_fits(path: str, max_sequences: int, max_len: int, dtype: torch.dtype,
                device: torch.device, tp: Shard | None) -> None:
    """Refuse, before any weight loads, weights and a KV pool that the device cannot hold (a
    rank's own: its slices of the weights and its KV heads). A model that outgrew its GPU would
    otherwise fail inside the load with CUDA's out-of-memory error."""
    a = ModelArgs.from_dir(path)
    if tp is not None:
        a = local_args(a, layout(a, tp.rank, tp.world, f"{path}/config.json"))
    weights = weight_bytes(a, dtype, tp)
    if device.type == "cpu" and dtype in cpu_linear.DTYPES:   # the LM head packed beside it
        weights += vocab_rows(a, tp) * a.hidden_size * dtype.itemsize
    kv = KVCache.bytes_needed(a.num_layers, max_sequences, max_len, a.num_kv_heads, a.head_dim,
                              dtype)
    free = free_memory(device)
    if weights + kv > free:
        rank = "" if tp is None else f" (rank {tp.rank} of {tp.world})"
        raise CheckpointError(
            f"{path}: weights of {weights / 2**30:.2f} GiB and a KV slot pool of {max_sequences} "
            f"sequences x {max_len} tokens of {kv / 2**30:.2f} GiB{rank} need "
            f"{(weights + kv) / 2**30:.2f} GiB, only {free / 2**30:.2f} GiB free on {device}: "
            f"lower max_sequences or max_seq_len, or shard the target over more GPUs "
            f"(SPECDEC_TENSOR_PARALLEL)")


def free_memory(device: torch.device) -> int:
    """Bytes free for a model on `device`: the GPU's, or the RAM the kernel can give."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_ram()


def available_ram(meminfo: str = "/proc/meminfo") -> int:
    """Bytes the kernel can give without swapping: MemAvailable, which counts the page cache it
    can drop. MemFree (sysconf's free pages, the fallback off Linux) does not: after checkpoints
    were written or read it fell to 0.26 GiB on a 24 GiB machine with 23 GiB available, and
    refused a 0.56 GiB model (a CI failure of 2026-11-26)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024   # kB
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
