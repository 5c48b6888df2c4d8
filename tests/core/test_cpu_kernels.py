"""specdec/kernels/cpu: the CPU's kernels, built at load, exact per row at any row count.

The linear kernel must agree with F.linear within float rounding and the attention kernel with a
float64 softmax over each query's keys; each must give a row (a query) the bits it gets alone
(the exact mode counts on it); an engine on the CPU must serve with both, every family's
variations included (windows, capped scores, partial rotary, q/k norms, biases), and a machine
where they cannot build must keep PyTorch's operators with the reason said.
"""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from specdec.kernels.cpu import attention, build, linear, pointwise
from specdec.runtime.engine import Engine
from specdec.runtime.batch import Batch
from specdec.runtime.model import Linear, RMSNorm
from specdec.records import Request
from tests.core.conftest import generate
from tests.tiny_checkpoints import make_checkpoint

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))

LIB = build.load()
needs_kernel = pytest.mark.skipif(LIB is None, reason=f"no CPU kernels here: {build.reason()}")
TOL = {torch.float32: 2e-5, torch.bfloat16: 1e-2}
CPU = torch.device("cpu")


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n,k", [(64, 16), (200, 37), (3 * 64 + 1, 576), (7, 5)])
def test_equals_a_float64_reference(dtype, n, k):
    gen = torch.Generator().manual_seed(n * 1000 + k)
    w = torch.randn(n, k, generator=gen).to(dtype)
    x = torch.randn(20, k, generator=gen).to(dtype)
    packed = linear.pack(w)
    pairs = dtype == torch.bfloat16 and linear._pairs[0]   # AVX512_BF16: by pairs of k
    assert packed.shape == ((-(-n // 64), -(-k // 2), 64, 2) if pairs else (-(-n // 64), k, 64))
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


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv,d,window,cap", [(9, 3, 64, 0, None), (4, 1, 32, 8, None),
                                                   (8, 8, 16, 0, 50.0), (4, 2, 96, 5, 20.0)])
def test_attention_equals_a_float64_softmax_and_each_query_is_its_own(dtype, heads, kv, d,
                                                                     window, cap):
    gen = torch.Generator().manual_seed(heads * 100 + d)
    slots, max_len = 4, 70
    ck = torch.randn(slots, max_len, kv, d, generator=gen).to(dtype)
    cv = torch.randn(slots, max_len, kv, d, generator=gen).to(dtype)
    # Two rows of 4 tokens each: a verification from position 30 in slot 1, a prefill's tail in
    # slot 2 (positions 0-3), and a padded token of row 1 that writes to scratch slot 3.
    positions = torch.tensor([[30, 31, 32, 33], [0, 1, 2, 3]])
    write = torch.tensor([[1, 1, 1, 1], [2, 2, 2, 3]])
    read = torch.tensor([1, 2])
    q = torch.randn(2, 4, heads, d, generator=gen).to(dtype)
    qkv = torch.randn(2, 4, 2 * kv, d, generator=gen).to(dtype)
    k, v = qkv[:, :, :kv], qkv[:, :, kv:]            # token-strided views, as the model hands them
    scale = d ** -0.5
    flat = (write.reshape(-1).contiguous(), positions.reshape(-1).contiguous(),
            read[:, None].expand(2, 4).contiguous().view(-1))
    out = attention.attend(q, k, v, ck, cv, *flat, window, scale, cap)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.equal(ck[write, positions], k) and torch.equal(cv[write, positions], v)
    ref = attention.reference(q.view(8, heads, d), ck, cv, flat[2], flat[1], window, scale, cap)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.view(8, heads, d).double(), ref, rtol=tol, atol=tol)
    # Each query alone (the same pool, its own token written again: the same values) has the
    # bits it had among the others.
    for b in range(2):
        for t in range(4):
            one = attention.attend(q[b:b + 1, t:t + 1], k[b:b + 1, t:t + 1], v[b:b + 1, t:t + 1],
                                   ck, cv, write[b, t:t + 1].clone(), positions[b, t:t + 1].clone(),
                                   read[b:b + 1].clone(), window, scale, cap)
            assert torch.equal(one[0, 0], out[b, t]), (b, t)


@needs_kernel
def test_attention_refuses_a_non_contiguous_index():
    q = torch.randn(1, 2, 2, 16)
    kv = torch.randn(1, 2, 1, 16)
    cache = torch.zeros(2, 8, 1, 16)
    strided = torch.tensor([0, 0, 0, 0])[::2]
    with pytest.raises(ValueError, match="contiguous int64 per token"):
        attention.attend(q, kv, kv, cache, cache.clone(), strided, torch.tensor([0, 1]),
                         torch.tensor([0, 0]), 0, 0.25, None)


@needs_kernel
@pytest.mark.parametrize("variant", ["llama3_gqa_tied", "mistral_window", "qwen2_bias",
                                     "qwen3_window", "gemma2", "gemma3", "phi3_longrope"])
def test_an_engine_on_the_kernels_scores_as_pytorch_does(tmp_path, variant):
    """Logits of a ragged batch (a prefill beside a verification, padding between) through
    the engine's forward, on the CPU kernels (its real tokens alone) and on PyTorch's operators
    ([B, T] padded), agree in float32; the kernels' engine serves its attention by them."""
    path = make_checkpoint(tmp_path / variant, variant)
    engines = [Engine.load(str(path), 4, 96, torch.float32, CPU, cpu_kernel=k)
               for k in (False, True)]
    assert engines[1].model.cpu_attention and not engines[0].model.cpu_attention
    outs = []
    for e in engines:
        prefill = Batch.build([list(range(3, 40))], [0], [0], e.cache, CPU)
        verify = Batch.build([[7, 8, 9], [11] * 20], [37, 0], [0, 1], e.cache, CPU)
        assert verify.real is not None and len(verify.real) == 23   # its padding dropped
        with torch.inference_mode():
            e.model(prefill, e.cache)
            outs.append(e.model.logits(e.model(verify, e.cache))[:, :3])
    torch.testing.assert_close(outs[1], outs[0], rtol=2e-4, atol=2e-4)


@needs_kernel
def test_a_head_size_the_attention_kernel_cannot_take_keeps_sdpa(tmp_path):
    path = make_checkpoint(tmp_path / "odd", "llama2", head_dim=12)
    e = Engine.load(str(path), 2, 64, torch.float32, CPU)
    assert e.cpu_kernel and not e.model.cpu_attention
    assert not attention.usable(4, 4, 12, torch.float32)
    assert attention.usable(4, 4, 16, torch.float32)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gemma", [False, True])
def test_the_fused_norm_is_the_modules_and_each_row_its_own(dtype, gemma):
    """model.RMSNorm with `cpu` set (the residual add and the norm in one call) against the
    same module's PyTorch operators: the sum bit for bit, the norm within a rounding; a row's
    bits the same at any row count."""
    gen = torch.Generator().manual_seed(int(gemma))
    norm = RMSNorm(576, 1e-5, gemma)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(576, generator=gen) * 0.2 + (0 if gemma else 1))
    norm = norm.to(dtype)
    x = torch.randn(2, 7, 576, generator=gen).to(dtype)
    residual = torch.randn(2, 7, 576, generator=gen).to(dtype)
    with torch.inference_mode():
        want_sum, want = norm.add(x, residual)
        norm.fused = pointwise
        got_sum, got = norm.add(x, residual)
        alone = torch.cat([norm.add(x[:, i:i + 1], residual[:, i:i + 1])[1] for i in range(7)], 1)
        plain = norm(x)
    assert torch.equal(got_sum, want_sum) and got.shape == want.shape
    tol = 2e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert torch.equal(alone, got)
    norm.fused = None
    torch.testing.assert_close(plain.float(), norm(x).float(), rtol=tol, atol=tol)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_times_up_is_pytorchs(dtype):
    gate_up = (torch.randn(3, 5, 2 * 1539, generator=torch.Generator().manual_seed(2)) * 6)
    gate_up = gate_up.to(dtype)
    gate, up = gate_up.chunk(2, -1)
    want = torch.nn.functional.silu(gate) * up
    got = pointwise.silu_mul(gate_up)
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    assert torch.equal(pointwise.silu_mul(gate_up[1:2]), got[1:2])


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_the_kernels_a_token_scores_alike_in_a_step_a_verification_and_a_batch(tmp_path,
                                                                                  dtype):
    """With every row computed alone (linear layers, attention, norms, SiLU, RoPE), the engine
    is batch-invariant without the exact mode's flag, in float32 as in bfloat16: a token's
    hidden state is bitwise the same as a one-token step, inside a 5-token verification, and
    beside another row of another length. Random weights at a real shape (grouped queries,
    a 32000-id vocabulary) make the near-ties where a difference would show."""
    import make_random_pair
    cfg = make_random_pair.scaled(make_random_pair.PRESETS["llama-1b"], 0.125, 32000)
    path = tmp_path / "llama"
    make_random_pair.write_model(path, cfg, make_random_pair.DEFAULT_TARGET, 0, 2**31, None,
                                 None)
    e = Engine.load(str(path), 4, 64, dtype, CPU)
    assert e.cpu_kernel and e.model.cpu_attention and not e.model.invariant
    prompt = list(range(3, 23))
    follow = [101, 7, 900, 31000, 12]

    def hidden(rows, starts, slots):
        batch = Batch.build(rows, starts, slots, e.cache, CPU)
        with torch.inference_mode():
            return e.model(batch, e.cache)
    hidden([prompt, prompt, prompt[:9]], [0, 0, 0], [0, 1, 2])
    steps = torch.cat([hidden([[t]], [20 + i], [0])[:, 0] for i, t in enumerate(follow)])
    verify = hidden([follow], [20], [1])[0]
    beside = hidden([follow, [5, 6, 7]], [20, 9], [1, 2])[0]
    assert torch.equal(verify, steps) and torch.equal(beside, steps)


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
    assert not e.model.cpu_attention
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


@pytest.fixture
def two_threads():
    assert build.set_threads(2) == 2
    yield
    build.set_threads(1)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_threads_share_a_call_and_change_no_bit(dtype, two_threads):
    """Tiles and queries shared out between threads (pool.c) give the bits of one thread."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(64 * 40 + 5, 96, generator=gen).to(dtype)
    x = torch.randn(9, 96, generator=gen).to(dtype)
    packed = linear.pack(w)
    q = torch.randn(1, 24, 8, 32, generator=gen).to(dtype)
    kv = torch.randn(1, 24, 4, 32, generator=gen).to(dtype)
    cache = torch.randn(4, 64, 2, 32, generator=gen).to(dtype)
    per_token = (torch.arange(24) % 3, torch.arange(24) + 10, torch.arange(24) % 3)

    def both():
        ck, cv = cache.clone(), cache.clone()
        return (linear.linear(x, packed, w.shape[0]),
                attention.attend(q, kv[:, :, :2], kv[:, :, 2:], ck, cv, *per_token, 0, 0.2, None))
    shared = [both() for _ in range(5)]
    build.set_threads(1)
    alone = both()
    for y, a in shared:
        assert torch.equal(y, alone[0]) and torch.equal(a, alone[1])


@needs_kernel
def test_calls_from_two_threads_at_once_are_each_right(two_threads):
    """Two engines of one process may call from two threads: one call has the helpers, the
    other runs on its own thread; both right."""
    import threading
    gen = torch.Generator().manual_seed(4)
    ws = [torch.randn(64 * 30, 128, generator=gen) for _ in range(2)]
    xs = [torch.randn(5, 128, generator=gen) for _ in range(2)]
    packed = [linear.pack(w) for w in ws]
    want = [linear.linear(x, p, w.shape[0]) for x, p, w in zip(xs, packed, ws)]
    bad = []

    def run(i):
        for _ in range(200):
            if not torch.equal(linear.linear(xs[i], packed[i], ws[i].shape[0]), want[i]):
                bad.append(i)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not bad and not any(t.is_alive() for t in threads)


@needs_kernel
def test_a_forked_child_starts_its_own_helpers(two_threads):
    import os
    w = torch.randn(64 * 20, 64)
    x = torch.randn(3, 64)
    packed = linear.pack(w)
    want = linear.linear(x, packed, w.shape[0])   # the parent's helpers are running
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:   # the child: its own helpers, the same bits
        ok = torch.equal(linear.linear(x, packed, w.shape[0]), want)
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    import select
    ready = select.select([read], [], [], 60)[0]
    if not ready:   # hung on the parent's helpers, which a child does not have
        os.kill(pid, 9)
    got = os.read(read, 1) if ready else b""
    os.waitpid(pid, 0)
    assert got == b"1"
