"""Tensor parallelism over PyTorch's distributed runtime (Megatron-LM's layout, Shoeybi et al.
2019): each rank holds a slice of every attention and MLP matrix and of the vocabulary.

- qkv_proj and gate_up_proj are column-parallel: a rank holds its query heads, its key/value
  heads (a whole head replicated on world / kv ranks when there are fewer key/value heads than
  ranks) and its intermediate columns, each part sliced and re-fused per rank.
- o_proj and down_proj are row-parallel: each rank's partial sum, one all_reduce after
  attention and one after the MLP.
- The embedding and LM head hold ceil(V / world) vocabulary rows per rank (the last one padded
  with zero rows): an id outside a rank's rows embeds as zeros there, and one all_reduce adds
  the one rank's row to zeros, so every rank's embedding is exact. The logits' slices are
  all_gathered: every rank holds the full logits and runs the same deterministic verification
  and counter-based sampling, so every rank commits the same tokens without a broadcast.
A collective's result is the same tensor on every rank and its order of additions is fixed, so a
degree-N forward is deterministic (and batch-invariant where each rank's arithmetic is).
"""
from __future__ import annotations

import datetime
import math
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist

from ..config import CheckpointError, ModelArgs


@dataclass
class Shard:
    """This rank's place: rank r of world ranks, over `group` (None: the default group)."""
    rank: int
    world: int
    group: object = None

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, group=self.group)
        return x

    def gather_last(self, x: torch.Tensor, size: int) -> torch.Tensor:
        """Every rank's x [..., n] concatenated in rank order along the last dim, cut to size."""
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.world)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, -1)[..., :size]


@dataclass(frozen=True)
class Layout:
    """What rank `rank` of `world` holds, in the checkpoint's (full) coordinates."""
    rank: int
    world: int
    heads: tuple[int, int]        # [first, end) query heads
    kv_heads: tuple[int, int]     # [first, end) key/value heads
    columns: tuple[int, int]      # [first, end) intermediate columns
    vocab: tuple[int, int]        # [first, end) vocabulary rows (end - first < rows: padded)
    rows: int                     # vocabulary rows per rank

    @property
    def num_heads(self) -> int:
        return self.heads[1] - self.heads[0]

    @property
    def num_kv_heads(self) -> int:
        return self.kv_heads[1] - self.kv_heads[0]


def layout(args: ModelArgs, rank: int, world: int, source: str = "config.json") -> Layout:
    """This rank's slices; refuses shapes that do not divide, naming the field and both values."""
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"tensor parallel: rank {rank} of degree {world}")
    h, kv, inter = args.num_heads, args.num_kv_heads, args.intermediate_size
    if h % world:
        raise CheckpointError(f"{source}: num_attention_heads {h} is not divisible by the "
                              f"tensor-parallel degree {world}")
    if kv % world and world % kv:
        raise CheckpointError(f"{source}: num_key_value_heads {kv} neither divides nor is "
                              f"divisible by the tensor-parallel degree {world}")
    if inter % world:
        raise CheckpointError(f"{source}: intermediate_size {inter} is not divisible by the "
                              f"tensor-parallel degree {world}")
    hl, il = h // world, inter // world
    if kv >= world:
        kvl = kv // world
        kv_heads = (rank * kvl, (rank + 1) * kvl)
    else:   # world / kv ranks share one key/value head: the one their query heads read
        j = rank * hl // (h // kv)
        kv_heads = (j, j + 1)
    rows = math.ceil(args.vocab_size / world)
    first = min(rank * rows, args.vocab_size)
    return Layout(rank, world, (rank * hl, (rank + 1) * hl), kv_heads,
                  (rank * il, (rank + 1) * il), (first, min(first + rows, args.vocab_size)), rows)


def local_args(args: ModelArgs, place: Layout) -> ModelArgs:
    """The arguments a rank's layers are built from: its heads and columns; the vocabulary and
    everything else stay the checkpoint's (the engine reads vocab_size as the full one)."""
    return replace(args, num_heads=place.num_heads, num_kv_heads=place.num_kv_heads,
                   intermediate_size=place.columns[1] - place.columns[0])


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def init(rank: int, world: int, address: str, port: int, device: torch.device,
         timeout_s: float = 60.0) -> Shard:
    """Join the process group at tcp://address:port (rank 0 serves the store) and return this
    rank's Shard. Collectives fail after timeout_s rather than hang on a dead rank."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device), init_method=f"tcp://{address}:{port}",
                            rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    return Shard(rank, world)


def close() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
