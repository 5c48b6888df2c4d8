"""Load one rank's shard of a checkpoint: each tensor's slice read from the safetensors file
(safe_open's get_slice), never the whole tensor, so no rank ever holds a full copy of a matrix.

One exception: an EAGLE-3 head runs on rank 0 alone (parallel_engine), and one without an
embedding of its own embeds with the target's whole table. Rank 0 then reads that table whole:
its own vocabulary rows are the table's first (parallel.layout), so its VocabEmbedding reads
rows 0..rows - 1 of it, a tied LM head is a view of them, and the head shares all of it."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..config import CheckpointError, ModelArgs
from ..model import FUSED, Transformer, on_meta, rope_table
from .parallel import Layout, Shard, layout, local_args
from ..weights import _IGNORED_SUFFIXES, _checkpoint_names, safetensors_files

EMBED = "model.embed_tokens.weight"


def load_shard(path: str | Path, dtype: torch.dtype, device: torch.device | str,
               tp: Shard, head_path: str | Path | None = None) -> Transformer:
    """Rank tp.rank's Transformer: its heads, columns and vocabulary rows (parallel.py).
    head_path: the EAGLE-3 head rank 0 serves; without an embedding of its own, rank 0's
    embedding holds the whole table (the module docstring)."""
    path = Path(path)
    full = ModelArgs.from_dir(path)
    place = layout(full, tp.rank, tp.world, f"{path}/config.json")
    with on_meta():
        model = Transformer(local_args(full, place), tp)
        reference = Transformer(full)   # the full shapes, to check the files against
    names = [n for n in model.state_dict()
             if not (full.tie_word_embeddings and n == "lm_head.weight")]
    with ExitStack() as stack:
        files = {}
        for file in safetensors_files(path):
            try:
                f = stack.enter_context(safe_open(str(file), "pt", device="cpu"))
            except (OSError, SafetensorError) as e:
                raise CheckpointError(f"{file}: cannot be read: {e}") from None
            files.update({k: f for k in f.keys() if not k.endswith(_IGNORED_SUFFIXES)})
        if full.tie_word_embeddings:
            files.pop("lm_head.weight", None)
        expected = set(names if full.fused_checkpoint else _checkpoint_names(names))
        missing, unexpected = expected - set(files), set(files) - expected
        if missing or unexpected:
            raise CheckpointError(
                f"{path}: weights do not match config.json: missing {sorted(missing)[:5]}, "
                f"unexpected {sorted(unexpected)[:5]}")
        reader = _Reader(files, full, reference, place, path)
        table = None   # [V, D]: the whole embedding, on rank 0 for a head that shares it
        if tp.rank == 0 and head_path is not None and not _own_embedding(head_path):
            table = reader.read(EMBED, whole=True).to(device=device, dtype=dtype)
        state = {n: table[: place.rows] if n == EMBED and table is not None
                 else reader.read(n).to(device=device, dtype=dtype) for n in names}
    for name, tensor in state.items():
        want = model.get_parameter(name).shape
        assert tensor.shape == want, (name, tuple(tensor.shape), tuple(want))
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()   # a tied LM head: rank 0's rows, a view of the table
    if table is not None:   # its forward reads rows 0..rows - 1 of it (VocabEmbedding)
        model.model.embed_tokens.weight = torch.nn.Parameter(table, requires_grad=False)
    model.inv_freq = rope_table(full).to(device)
    return model.eval().requires_grad_(False)


def _own_embedding(head_path: str | Path) -> bool:
    """Whether the head's files hold an embed_tokens.weight (both formats may leave it out)."""
    for file in safetensors_files(Path(head_path)):
        try:
            with safe_open(str(file), "pt", device="cpu") as f:
                if "embed_tokens.weight" in f.keys():
                    return True
        except (OSError, SafetensorError) as e:
            raise CheckpointError(f"{file}: cannot be read: {e}") from None
    return False


class _Reader:
    """A model parameter's shard, from the checkpoint tensors it comes from."""

    def __init__(self, files: dict, full: ModelArgs, reference: Transformer, place: Layout,
                 path: Path):
        self.files, self.full, self.reference, self.place, self.path = \
            files, full, reference, place, path

    def read(self, name: str, whole: bool = False) -> torch.Tensor:
        """whole: the full tensor (the embedding a head shares on rank 0)."""
        p, a, d = self.place, self.full, self.full.head_dim
        if whole:
            return self._slice(name, self._shape(name), 0, 0, self._shape(name)[0])
        if name in (EMBED, "lm_head.weight"):
            rows = self._slice(name, self._shape(name), 0, *p.vocab)
            return torch.nn.functional.pad(rows, (0, 0, 0, p.rows - rows.shape[0]))
        for fused, parts in FUSED.items():
            if f".{fused}." not in name:
                continue
            if fused == "self_attn.qkv_proj":
                sizes = [a.num_heads * d, a.num_kv_heads * d, a.num_kv_heads * d]
                spans = [p.heads, p.kv_heads, p.kv_heads]
                unit = d
            else:
                sizes, spans, unit = [a.intermediate_size] * 2, [p.columns] * 2, 1
            pieces, offset = [], 0
            for part, size, (lo, hi) in zip(parts, sizes, spans):
                if a.fused_checkpoint:
                    source, base = name, offset
                    shape = self._shape(name)
                else:
                    source, base = name.replace(f".{fused}.", f".{part}."), 0
                    shape = (size,) + tuple(self._shape(name)[1:])
                pieces.append(self._slice(source, shape, 0, base + lo * unit, base + hi * unit))
                offset += size
            return torch.cat(pieces)
        if name.endswith("self_attn.o_proj.weight"):
            return self._slice(name, self._shape(name), 1, p.heads[0] * d, p.heads[1] * d)
        if name.endswith("mlp.down_proj.weight"):
            return self._slice(name, self._shape(name), 1, *p.columns)
        whole = self.read(name, whole=True)
        if name.endswith("self_attn.o_proj.bias") and p.rank:
            return torch.zeros_like(whole)   # added once, by rank 0, before the all_reduce
        return whole

    def _shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.reference.get_parameter(name).shape)

    def _slice(self, name: str, shape: tuple[int, ...], dim: int, lo: int,
               hi: int) -> torch.Tensor:
        """Rows (dim 0) or columns (dim 1) lo:hi of checkpoint tensor `name`, whose full shape
        must be `shape`."""
        sl = self.files[name].get_slice(name)
        if tuple(sl.get_shape()) != shape:
            raise CheckpointError(f"{self.path}: {name} has shape {tuple(sl.get_shape())}, "
                                  f"config.json implies {shape}")
        return sl[lo:hi] if dim == 0 else sl[:, lo:hi]
