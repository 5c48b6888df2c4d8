"""specdec/runtime/gpu_pointwise.py: the layers' add + RMSNorm and SiLU x up as Triton kernels, run
here in Triton's interpreter (tests/core/conftest.py) as a GPU would compile them. Each must agree
with model.RMSNorm's and MLP's PyTorch operators within a rounding of the dtype (the residual sum
bit for bit), give a row the same bits alone as among others, and, attached to a model, leave its
hidden states within a rounding and a verification's tokens its steps' bit for bit."""
import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from specdec.runtime import gpu_pointwise  # noqa: E402
from specdec.runtime.engine import Engine  # noqa: E402
from specdec.runtime.batch import Batch  # noqa: E402
from tests.tiny_checkpoints import make_checkpoint  # noqa: E402

CPU = torch.device("cpu")
TOL = {torch.float32: 2e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gemma", [False, True])
def test_add_and_rmsnorm_are_the_models_row_by_row(dtype, gemma):
    gen = torch.Generator().manual_seed(int(gemma))
    d = 200   # not a power of two: the row's mask
    w = (torch.randn(d, generator=gen) * 0.2 + (0 if gemma else 1)).to(dtype)
    x = torch.randn(9, d, generator=gen).to(dtype)
    add = torch.randn(9, d, generator=gen).to(dtype)
    total, out = gpu_pointwise.rmsnorm(x, w, 1e-6, gemma, add)
    want_total, want = gpu_pointwise.reference_rmsnorm(x, w, 1e-6, gemma, add)
    assert torch.equal(total, want_total)
    torch.testing.assert_close(out.float(), want.float(), rtol=TOL[dtype], atol=TOL[dtype])
    for rows in (slice(0, 1), slice(3, 5), slice(8, 9)):
        assert torch.equal(gpu_pointwise.rmsnorm(x[rows], w, 1e-6, gemma, add[rows])[1],
                           out[rows])
    alone_total, alone = gpu_pointwise.rmsnorm(x, w, 1e-6, gemma)
    assert alone_total is not None and torch.equal(alone_total, x)
    torch.testing.assert_close(alone.float(),
                               gpu_pointwise.reference_rmsnorm(x, w, 1e-6, gemma)[1].float(),
                               rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_times_up_is_the_mlps_row_by_row(dtype):
    gen = torch.Generator().manual_seed(2)
    inner = 1500   # past one block of SILU_BLOCK: two programs a row
    gate_up = (torch.randn(2, 3, 2 * inner, generator=gen) * 4).to(dtype)
    got = gpu_pointwise.silu_mul(gate_up)
    gate, up = gate_up.chunk(2, -1)
    assert got.shape == (2, 3, inner)
    torch.testing.assert_close(got.float(), (F.silu(gate) * up).float(),
                               rtol=4 * TOL[dtype], atol=4 * TOL[dtype])
    assert torch.equal(gpu_pointwise.silu_mul(gate_up[1:, 2:]), got[1:, 2:])


def test_the_probe_passes_here_and_refuses_what_it_cannot_serve():
    assert gpu_pointwise.probe(CPU, torch.bfloat16, 64, 96) is None
    assert "past" in gpu_pointwise.probe(CPU, torch.float32, 20000, 96)
    assert "not for" in gpu_pointwise.probe(CPU, torch.float64, 64, 96)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attached_a_model_keeps_its_hidden_states_and_its_batch_invariance(tmp_path, dtype):
    """The engine with the kernels attached (as fused_pointwise attaches them on CUDA) against
    the same checkpoint on PyTorch's operators: hidden states within a rounding; in the exact
    mode a verification's tokens score bit for bit as its one-token steps do."""
    path = make_checkpoint(tmp_path / "t", seed=3)
    plain = Engine.load(str(path), 2, 64, dtype, CPU, cpu_kernel=False, batch_invariant=True)
    fused = Engine.load(str(path), 2, 64, dtype, CPU, cpu_kernel=False, batch_invariant=True)
    assert gpu_pointwise.attach(fused.model) is None
    assert not fused.fused_pointwise   # the engine attaches them on CUDA only
    prompt, follow = list(range(3, 15)), [7, 21, 40]

    def hidden(e, rows, starts, slots):
        with torch.inference_mode():
            return e.model(Batch.build(rows, starts, slots, e.cache, CPU), e.cache)
    want, got = (hidden(e, [prompt], [0], [0]) for e in (plain, fused))
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    hidden(fused, [prompt], [0], [1])
    steps = torch.cat([hidden(fused, [[t]], [12 + i], [0])[:, 0] for i, t in enumerate(follow)])
    assert torch.equal(hidden(fused, [follow, [5]], [12, 12], [1, 0])[0], steps)
