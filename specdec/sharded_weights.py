"""Load one rank's shard of a checkpoint: each tensor's slice read from the safetensors file
(safe_open's get_slice), never the whole tensor, so no rank ever holds a full copy."""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import CheckpointError, ModelArgs
from .model import FUSED, Transformer, rope_table
from .parallel import Layout, Shard, layout, local_args
from .weights import _IGNORED_SUFFIXES, _checkpoint_names, safetensors_files


def load_shard(path: str | Path, dtype: torch.dtype, device: torch.device | str,
               tp: Shard) -> Transformer:
    """Rank tp.rank's Transformer: its heads, columns and vocabulary rows (parallel.py)."""
    path = Path(path)
    full = ModelArgs.from_dir(path)
    place = layout(full, tp.rank, tp.world, f"{path}/config.json")
    with torch.device("meta"):
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
        state = {n: reader.read(n).to(device=device, dtype=dtype) for n in names}
    for name, tensor in state.items():
        want = model.get_parameter(name).shape
        assert tensor.shape == want, (name, tuple(tensor.shape), tuple(want))
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    model.inv_freq = rope_table(full).to(device)
    return model.eval().requires_grad_(False)


class _Reader:
    """A model parameter's shard, from the checkpoint tensors it comes from."""

    def __init__(self, files: dict, full: ModelArgs, reference: Transformer, place: Layout,
                 path: Path):
        self.files, self.full, self.reference, self.place, self.path = \
            files, full, reference, place, path

    def read(self, name: str) -> torch.Tensor:
        p, a, d = self.place, self.full, self.full.head_dim
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
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
        whole = self._slice(name, self._shape(name), 0, 0, self._shape(name)[0])
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
