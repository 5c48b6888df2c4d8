"""How big the benchmarked pair is: parameters in its checkpoints, bytes of the server's KV slot
pool."""
from __future__ import annotations

import math
from pathlib import Path


def param_count(path: Path) -> int | None:
    """Parameters in the directory's *.safetensors (None when they cannot be read: the figure is
    informational only)."""
    try:
        from safetensors import safe_open
        total = 0
        for f in sorted(Path(path).glob("*.safetensors")):
            with safe_open(str(f), "pt") as st:
                for name in st.keys():
                    total += math.prod(int(n) for n in st.get_slice(name).get_shape())
        return total
    except Exception:
        return None


def kv_pool_bytes(target: Path, draft: Path, max_sequences: int, max_seq_len: int, dtype) -> dict:
    from specdec.runtime.config import ModelArgs
    from specdec.runtime.kv_cache import KVCache
    out = {}
    for role, path in (("target", target), ("draft", draft)):
        a = ModelArgs.from_dir(path)
        out[role] = KVCache.bytes_needed(a.num_layers, max_sequences, max_seq_len,
                                         a.num_kv_heads, a.head_dim, dtype)
    out["total"] = out["target"] + out["draft"]
    out.update(max_sequences=max_sequences, max_seq_len=max_seq_len, dtype=str(dtype))
    return out
