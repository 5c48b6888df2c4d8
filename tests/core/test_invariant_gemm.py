"""invariant_gemm's Triton kernel, without a GPU in Triton's interpreter (conftest.py): its
indexing, masking and strides, rows that do not depend on M, and the load probe's fallback. A
GPU's own arithmetic is checked at load by `probe`, and here by the CUDA test at the end."""
import logging

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")

from specdec.kernels import invariant, invariant_gemm  # noqa: E402
from tests.core.conftest import Recording, without_triton  # noqa: E402


@pytest.fixture(autouse=True)
def unprobed(monkeypatch):
    monkeypatch.setattr(invariant_gemm, "_ready", {})
    monkeypatch.setattr(invariant_gemm, "_wide", {})
    if not torch.cuda.is_available():   # the interpreter: fewer calls, one M tile and two
        monkeypatch.setattr(invariant_gemm, "_PROBE_ROWS", (1, 2, 5, 17))
        monkeypatch.setattr(invariant_gemm, "_WIDE_ROWS", (17,))


def weights(n, k, dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matches_f_linear_past_every_tile_edge(dtype):
    w = weights(70, 200, dtype)        # N and K not multiples of BLOCK_N, BLOCK_K
    x = weights(17, 200, dtype, seed=1)  # M past one BLOCK_M
    got = invariant_gemm.linear(x, w)
    ref = F.linear(x.float(), w.float())
    assert got.dtype == dtype and got.shape == (17, 70)
    tol = 1e-4 if dtype == torch.float32 else 0.05
    assert (got.float() - ref).abs().max().item() <= tol * ref.abs().max().item()


def test_a_rows_result_does_not_depend_on_the_rows_beside_it():
    w = weights(64, 256)
    x = weights(40, 256, seed=1)
    alone = torch.cat([invariant_gemm.linear(x[i:i + 1], w) for i in range(40)])
    for m in (2, 3, 16, 17, 40):
        assert torch.equal(invariant_gemm.linear(x[:m], w), alone[:m]), m
    # the same rows after others: another M tile
    assert torch.equal(invariant_gemm.linear(x[20:40], w), alone[20:40])


def test_wide_tiles_past_every_tile_edge():
    """64 x 64 tiles over 130 rows and 70 columns (three M tiles, two N tiles, the last of each
    partial): close to F.linear, and in the interpreter the same bits as 16-row tiles (the same
    products summed in the same order; on a GPU `probe` checks its own instruction's)."""
    w = weights(70, 200)
    x = weights(130, 200, seed=1)
    wide = invariant_gemm.linear(x, w, True)
    ref = F.linear(x.float(), w.float())
    assert (wide.float() - ref).abs().max().item() <= 0.05 * ref.abs().max().item()
    assert torch.equal(wide, invariant_gemm.linear(x, w, False))


class Launches:
    """The GEMM kernel's launches from here on: the tile height (BM) of each."""

    def __init__(self, monkeypatch):
        self.bm: list[int] = []
        monkeypatch.setattr(invariant_gemm, "_kernel", Recording(
            invariant_gemm._build(), lambda grid, kw: self.bm.append(kw["BM"])))


def test_calls_of_many_rows_take_the_wide_tiles_once_probed(monkeypatch):
    w = weights(64, 128)
    launches = Launches(monkeypatch)
    invariant_gemm.linear(weights(80, 128), w)
    assert launches.bm == [invariant_gemm.BLOCK_M]   # not probed: 16-row tiles
    assert invariant_gemm.probe(w) and invariant_gemm.probed()["[64, 128] float16 cpu, wide tiles"]
    launches.bm.clear()
    for m in (1, invariant_gemm.WIDE_FROM - 1, invariant_gemm.WIDE_FROM, 80):
        invariant_gemm.linear(weights(m, 128), w)
    assert launches.bm == [16, 16, 64, 64]


def test_wide_tiles_that_change_a_rows_bits_are_refused_alone(monkeypatch, caplog):
    real = invariant_gemm.linear

    def off_when_wide(x, w, wide=None):   # the wide tiles' products rounded otherwise
        out = real(x, w, wide)
        return out * (1 + 2 ** -9) if wide else out
    monkeypatch.setattr(invariant_gemm, "linear", off_when_wide)
    w = weights(64, 128)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert invariant_gemm.probe(w)   # the 16-row tiles stay
    assert "in 64 x 64 tiles differ from each row alone" in caplog.text
    assert "calls of every size use 16-row tiles" in caplog.text
    monkeypatch.setattr(invariant_gemm, "linear", real)
    launches = Launches(monkeypatch)
    invariant_gemm.linear(weights(80, 128), w)
    assert launches.bm == [16]


def test_strided_input_and_weight():
    w = weights(64, 256)
    x = weights(5, 512, seed=1)[:, ::2]        # stride 2 along K
    wt = w.t().contiguous().t()                # column-major weight
    assert torch.equal(invariant_gemm.linear(x, wt), invariant_gemm.linear(x.contiguous(), w))


def test_no_rows():
    assert invariant_gemm.linear(weights(0, 128), weights(64, 128)).shape == (0, 64)


def test_probe_passes_and_is_remembered(monkeypatch):
    w = weights(64, 128)
    assert not invariant_gemm.ready(w)
    assert invariant_gemm.probe(w)
    assert invariant_gemm.ready(w)
    calls = []
    monkeypatch.setattr(invariant_gemm, "linear", lambda *a: calls.append(a))
    assert invariant_gemm.probe(weights(64, 128, seed=5))   # same shape: not probed again
    assert calls == []


def test_a_kernel_whose_rows_depend_on_m_is_refused(monkeypatch, caplog):
    monkeypatch.setattr(invariant_gemm, "linear",
                        lambda x, w, *a: F.linear(x, w) + x.shape[0] * 1e-3)
    w = weights(64, 128)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_gemm.probe(w)
    assert not invariant_gemm.ready(w)
    assert "rows differ from each row alone" in caplog.text and "cuBLAS" in caplog.text


def test_a_wrong_kernel_is_refused(monkeypatch, caplog):
    real = invariant_gemm.linear   # row-invariant, 10 % off
    monkeypatch.setattr(invariant_gemm, "linear", lambda x, w, *a: real(x, w, *a) * 1.1)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_gemm.probe(weights(64, 128))
    assert "against F.linear" in caplog.text


def test_no_triton_keeps_the_blocks(monkeypatch, caplog):
    without_triton(invariant_gemm, monkeypatch)
    w = weights(64, 128)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_gemm.probe(w)
    assert "No module named 'triton'" in caplog.text


def test_prepare_probes_only_16_bit_cuda_weights(monkeypatch):
    probed = []
    monkeypatch.setattr(invariant_gemm, "probe", probed.append)
    invariant.prepare(weights(64, 128))                  # the CPU keeps its blocked bmm
    invariant.prepare(weights(64, 128, torch.float32))
    assert probed == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("shape", [(6144, 4096), (4096, 14336), (32000, 1024)])
def test_cuda_kernel_passes_its_probe_at_real_shapes(shape):
    """On the GPU, compiled: what a load finds at an 8B model's fused qkv and down projections
    and a 32k-vocabulary LM head, in bfloat16 (a failure here is a fallback when serving), the
    wide tiles included (the same instruction as the 16-row ones: their rows' bits agree)."""
    w = (torch.randn(*shape, device="cuda") * shape[1] ** -0.5).to(torch.bfloat16)
    assert invariant_gemm.probe(w)
    assert invariant_gemm.probed()[f"{list(shape)} bfloat16 cuda:0, wide tiles"]
    invariant.prepare(w)
    for rows in (5, 80):   # 16-row tiles, wide tiles
        x = torch.randn(3, rows, shape[1], device="cuda", dtype=torch.bfloat16)
        ref = F.linear(x.float(), w.float())
        got = invariant.linear(x, w, None)   # through the kernel now
        assert (got.float() - ref).abs().max().item() <= 2 ** -6 * ref.abs().max().item()
