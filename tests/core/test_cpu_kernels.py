"""specdec/cpu: the CPU's kernels, built at load, exact per row at any row count.

The linear kernel must agree with F.linear within float rounding, give each row the bits it gets
alone (the exact mode counts on it), serve every model.Linear of an engine on the CPU, and leave a
machine where it cannot build on PyTorch's operators with the reason said.
"""
import pytest
import torch
import torch.nn.functional as F

from specdec.cpu import build, linear
from specdec.engine import Engine
from specdec.model import Batch, Linear
from specdec.records import Request
from tests.core.conftest import generate

LIB = build.load()
needs_kernel = pytest.mark.skipif(LIB is None, reason=f"no CPU kernels here: {build.reason()}")
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(64, 16), (200, 37), (3 * 64 + 1, 576), (7, 5)])
def test_equals_a_float64_reference(dtype, n, k):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=gen).to(dtype)
    x = torch.randn(20, k, generator=gen).to(dtype)
    packed = linear.pack(w)
    assert packed.shape == (-(-n // 64), k, 64)
    ref = F.linear(x.double(), w.double())
    for m in (1, 5, 6, 7, 13, 20):
        y = linear.linear(x[:m], packed, n)
        assert y.dtype == dtype and y.shape == (m, n)
        scale = ref[:m].abs().max().item()
        # float32: summed in order, one rounding a term; bfloat16: rounded once at the end
        assert (y.double() - ref[:m]).abs().max().item() <= TOL[dtype] * scale * max(k, 8) ** 0.5


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_has_its_own_bits_at_every_row_count(dtype):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(300, 576, generator=gen).to(dtype)
    x = torch.randn(40, 576, generator=gen).to(dtype)
    packed = linear.pack(w)
    alone = torch.cat([linear.linear(x[i:i + 1], packed, 300) for i in range(len(x))])
    for m in range(1, len(x) + 1):
        assert torch.equal(linear.linear(x[:m], packed, 300), alone[:m]), m
    # and as any row of a 3-d input, with a bias
    bias = torch.randn(300, generator=gen).to(dtype)
    y = linear.linear(x.view(4, 10, 576), packed, 300, bias)
    assert torch.equal(y, (alone + bias).view(4, 10, 300))


@needs_kernel
def test_empty_input_and_wrong_dtype():
    packed = linear.pack(torch.randn(70, 8))
    assert linear.linear(torch.randn(0, 8), packed, 70).shape == (0, 70)
    with pytest.raises(TypeError, match="bfloat16"):
        linear.linear(torch.randn(2, 8, dtype=torch.bfloat16), packed, 70)


@needs_kernel
def test_an_engine_packs_its_linear_layers(pair_dir):
    target, _ = pair_dir
    plain = Engine.load(str(target), 2, 128, torch.float32, torch.device("cpu"), cpu_kernel=False)
    fast = Engine.load(str(target), 2, 128, torch.float32, torch.device("cpu"))
    assert fast.cpu_kernel and not plain.cpu_kernel
    linears = [m for m in fast.model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed is not None for m in linears)
    # Unpacked weights are dropped, but for the LM head tied to the embedding (which keeps it).
    tied = fast.model.args.tie_word_embeddings
    assert all(m.weight is None for m in linears if m is not fast.model.lm_head)
    assert (fast.model.lm_head.weight is not None) == tied
    ids = [[5, 9, 2, 7, 11, 3]]
    outs = []
    for e in (plain, fast):
        batch = Batch.build(ids, [0], [0], e.cache, e.device)
        with torch.inference_mode():
            outs.append(e.model.logits(e.model(batch, e.cache)))
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-4, atol=1e-4)


@needs_kernel
def test_greedy_output_is_the_unpacked_engines(pair_dir):
    """The kernel's rounding differs from MKL's in low bits only: on the test pair the same
    greedy tokens, with speculation and without."""
    target, draft = pair_dir
    requests = [Request([1, 17, 33, 5], 48, k) for k in (0, 4)] + \
        [Request([2, 40, 41, 42, 43, 44], 48, k) for k in (0, 4)]
    runs = {}
    for kernel in (False, True):
        t = Engine.load(str(target), 8, 256, torch.float32, torch.device("cpu"), cpu_kernel=kernel)
        d = Engine.load(str(draft), 8, 256, torch.float32, torch.device("cpu"), cpu_kernel=kernel)
        runs[kernel] = [tokens for tokens, _, _ in generate(t, d, requests)]
    assert runs[True] == runs[False]
    assert runs[True][0] == runs[True][1] and runs[True][2] == runs[True][3]


def test_no_compiler_keeps_pytorch(monkeypatch, tmp_path, pair_dir, caplog):
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    assert build.load() is None
    assert "/bin/false failed" in build.reason()
    assert "the CPU kernels are unavailable" in caplog.text
    target, _ = pair_dir
    e = Engine.load(str(target), 1, 64, torch.float32, torch.device("cpu"))
    assert not e.cpu_kernel
    assert all(m.packed is None and m.weight is not None
               for m in e.model.modules() if isinstance(m, Linear))
    with pytest.raises(ValueError, match="cpu_kernel: .*/bin/false failed"):
        Engine.load(str(target), 1, 64, torch.float32, torch.device("cpu"), cpu_kernel=True)


def test_a_build_is_cached_per_source(monkeypatch, tmp_path):
    if not (build.shutil.which("cc") or build.shutil.which("gcc")):
        pytest.skip("no C compiler here")
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("CC", raising=False)
    assert build.load() is not None
    built = sorted(tmp_path.iterdir())
    assert [p.suffix for p in built] == [".so"]   # no temporary left behind
    stamp = built[0].stat().st_mtime_ns
    monkeypatch.setattr(build, "_loaded", {})
    assert build.load() is not None
    assert sorted(tmp_path.iterdir()) == built and built[0].stat().st_mtime_ns == stamp


def test_float64_and_other_devices_keep_pytorch(pair_dir):
    target, _ = pair_dir
    e = Engine.load(str(target), 1, 64, torch.float64, torch.device("cpu"))
    assert not e.cpu_kernel
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        Engine.load(str(target), 1, 64, torch.float64, torch.device("cpu"), cpu_kernel=True)
