import asyncio
import os
from typing import Callable

import pytest
import torch

# Without a GPU the exact mode's Triton kernels (specdec/kernels/triton_kernels.py) run in Triton's
# interpreter, which triton reads from the environment as it is imported: set before that.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _interpreted_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
    """tl.dot in the interpreter, each output a plain sum over K. The interpreter's own hands
    float32 products to numpy's matmul and so to OpenBLAS, whose Haswell and Zen kernels (an
    AMD EPYC's) sum a row's products in an order that depends on where the row sits in the
    tile: a query's output then depended on the tile's other rows (rows 6 and on of 16), as a
    GPU's compiled kernel never does, and the kernels' bit-equality tests failed there."""
    from triton.runtime.interpreter import TensorHandle
    acc = d.data.dtype
    products = a.data.astype(acc)[..., :, :, None] * b.data.astype(acc)[..., None, :, :]
    return TensorHandle(products.sum(axis=-2) + d.data, d.dtype.scalar)


def _rounded_cast(cast):
    """float32 to bfloat16 rounded to nearest even, as a GPU's cvt does: the interpreter's own
    truncates (triton 3.7.1), so a kernel's bf16 results read one unit in the last place low
    wherever PyTorch's round up."""
    def cast_impl(self, src, dst_type):
        import numpy as np
        import triton.language as tl
        from triton.runtime.interpreter import TensorHandle
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bf = torch.from_numpy(np.ascontiguousarray(src.data, np.float32)).to(torch.bfloat16)
            return TensorHandle(bf.view(torch.int16).numpy().view(np.uint16), tl.bfloat16)
        return cast(self, src, dst_type)
    return cast_impl


if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        from triton.runtime.interpreter import InterpreterBuilder
    except ImportError:   # no triton: the kernels' tests skip
        pass
    else:
        InterpreterBuilder.create_dot = _interpreted_dot
        InterpreterBuilder.cast_impl = _rounded_cast(InterpreterBuilder.cast_impl)

from specdec.runtime.engine import Engine
from specdec.decoding.local import LocalDrafter, LocalVerifier
from specdec.decoding.loop import open_policy, speculate
from specdec.planning.planner import Planner
from specdec.records import Chunk, Request
from specdec.runtime.weights import load_model
from tests.tiny_checkpoints import make_checkpoint, make_draft


@pytest.fixture(scope="session")
def pair_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = make_checkpoint(root / "target", "llama3_gqa_tied")
    return target, make_draft(target, root / "draft", noise=0.5)


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module's tests, the previous count restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def small_pair(tmp_path_factory):
    """A 5-token vocabulary: every short continuation's probability can be enumerated."""
    root = tmp_path_factory.mktemp("small")
    target = make_checkpoint(root / "t", "llama2", vocab_size=5, seed=3)
    return target, make_draft(target, root / "d", noise=1.0, seed=4)


def engines(pair, dtype=torch.float64, max_sequences=32, max_len=128):
    target, draft = pair
    cpu = torch.device("cpu")
    return (Engine(load_model(target, dtype, cpu), max_sequences, max_len, cpu),
            Engine(load_model(draft, dtype, cpu), max_sequences, max_len, cpu))


def generate(target: Engine, draft: Engine | None, requests: list[Request],
             planner: Planner | None = None, drafter=None, constraint=None,
             **options) -> list[tuple[list[int], object]]:
    """Run requests concurrently (batched like Triton would); returns (tokens, stats) each.

    planner: chooses k per round for requests with `auto` (else each request's exact k).
    drafter: the draft model's stand-in (default: the draft engine's; None without one).
    options: more keyword arguments of `speculate` (on_round, draft_timeout_s, ngram); the
    target's own drafters (in_target.py) are its in_target. constraint: request i's grammar is
    constraint(i) (None: none)."""
    drafter = drafter or (LocalDrafter(draft) if draft else None)
    verifier = LocalVerifier(target)

    async def one(i, req):
        chunks: list[Chunk] = []
        policy = open_policy(planner, req) if planner else None
        try:
            stats = await speculate(1000 + i, req, drafter, verifier, target.max_len,
                                    chunks.append, policy=policy,
                                    in_target=tuple(target.drafters),
                                    constraint=constraint(i) if constraint else None, **options)
        finally:
            if planner:
                planner.close(policy)
        return [t for c in chunks for t in c.tokens], stats, chunks

    async def run():
        return await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))

    return asyncio.run(run())


class Recording:
    """A Triton kernel whose launches call record(grid, its keyword arguments) first."""

    def __init__(self, kernel, record: Callable[[tuple, dict], None]):
        self.kernel, self.record = kernel, record

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.record(grid, kwargs)
            return self.kernel[grid](*args, **kwargs)
        return launch


def without_triton(module, monkeypatch) -> None:
    """invariant_gemm or invariant_attention as on a machine without triton: its kernel's
    import fails at first use."""
    def missing():
        raise ImportError("No module named 'triton'")
    monkeypatch.setattr(module, "_build", missing)
    monkeypatch.setattr(module, "_kernel", None)
