"""invariant_attention's Triton kernel, without a GPU in Triton's interpreter (conftest.py): it
attends like plain softmax attention (causal, windows, softcap, grouped queries, a head dim that
is no power of two), a query's output does not depend on what else the call holds nor on whether
the call splits its keys, a window's earlier keys are never read, the load probe refuses what
fails, and an engine that uses it keeps speculative greedy output exact."""
import logging

import pytest
import torch

pytest.importorskip("triton")

from specdec.kernels import invariant, invariant_attention  # noqa: E402
from specdec.runtime.engine import Engine  # noqa: E402
from specdec.records import Request  # noqa: E402
from specdec.runtime.sampling import SamplingParams  # noqa: E402
from specdec.runtime.weights import load_model  # noqa: E402
from tests.core.conftest import Recording, generate, without_triton  # noqa: E402
from tests.tiny_checkpoints import make_checkpoint, make_draft  # noqa: E402

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def unprobed(monkeypatch):
    monkeypatch.setattr(invariant_attention, "_ready", {})


def cache(kv, d, dtype=torch.float32, slots=4, length=200, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(slots, length, kv, d, generator=gen).to(dtype),
            torch.randn(slots, length, kv, d, generator=gen).to(dtype))


def queries(b, t, h, d, dtype=torch.float32, seed=1):
    return torch.randn(b, t, h, d, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("kv,g,d,window,softcap", [
    (2, 4, 32, 0, None), (1, 1, 48, 0, None), (2, 2, 32, 40, None), (2, 4, 32, 0, 20.0)])
def test_matches_plain_attention(kv, g, d, window, softcap):
    k, v = cache(kv, d)
    q = queries(4, 5, kv * g, d)
    slots = torch.tensor([1, 3, 0, 2])
    # a row within the first key block, one across three, one at the cache's end, and one
    # whose first query's window (40) starts at a block's last key
    positions = torch.tensor([[0, 1, 2, 3, 4], [120, 121, 122, 123, 124],
                              [195, 196, 197, 198, 199], [166, 167, 168, 169, 170]])
    got = invariant_attention.attend(q, k, v, slots, positions, window, d ** -0.5, softcap)
    ref = invariant_attention.reference(q, k, v, slots, positions, window, d ** -0.5, softcap)
    assert (got - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("window,alone_split,together_split", [
    (0, None, None), (70, None, None), (0, True, False), (300, False, True)])
def test_a_querys_output_does_not_depend_on_the_call(window, alone_split, together_split):
    """Six tokens across the first split's end, each alone and all in one call beside a short
    row and a long one, by a program per tile or per split (None: the call's own choice)."""
    k, v = cache(2, 32, torch.float16, length=600)
    q = queries(1, 6, 8, 32, torch.float16)
    edge = invariant_attention.SPLIT
    positions = torch.arange(edge - 3, edge + 3)[None]
    slot = torch.tensor([2])

    def attend(q_, slots, pos, split):
        return invariant_attention.attend(q_, k, v, slots, pos, window, 0.2, None, split)
    alone = [attend(q[:, i:i + 1], slot, positions[:, i:i + 1], alone_split)[0, 0]
             for i in range(6)]
    others = queries(2, 6, 8, 32, torch.float16, seed=7)
    together = attend(torch.cat([others[:1], q, others[1:]]), torch.tensor([0, 2, 3]),
                      torch.cat([torch.arange(6)[None], positions, torch.arange(590, 596)[None]]),
                      together_split)
    for i in range(6):
        assert torch.equal(together[1, i], alone[i]), i


@pytest.mark.parametrize("dtype,window,softcap,d", [
    (torch.float32, 0, None, 32), (torch.float16, 0, None, 48), (torch.float16, 300, None, 32),
    (torch.float16, 0, 20.0, 32)])
def test_split_keys_give_the_same_bits(dtype, window, softcap, d):
    """Rows in the first, second and third split of a 700-key cache: a program per split and
    the merge after equal a program per tile bit for bit, and plain attention closely."""
    k, v = cache(2, d, dtype, length=700)
    q = queries(3, 5, 8, d, dtype)
    slots = torch.tensor([1, 3, 0])
    positions = torch.tensor([[0, 1, 2, 3, 4], [254, 255, 256, 257, 258],
                              [690, 691, 692, 693, 694]])
    tiled, split = (invariant_attention.attend(q, k, v, slots, positions, window, 0.2, softcap,
                                               s) for s in (False, True))
    assert torch.equal(tiled, split)
    ref = invariant_attention.reference(q, k, v, slots, positions, window, 0.2, softcap)
    assert (split.float() - ref).abs().max().item() < (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("split", [False, True])
def test_a_window_reads_no_key_before_it(split):
    """Under a 250-key window, queries at 590-595 see keys from 341: the blocks before the
    tile's first (320) are skipped, the whole first split and part of the second. NaN there
    (which any read would spread through its block's weighted sum) changes no bit."""
    k, v = cache(2, 32, torch.float16, length=600)
    q = queries(1, 6, 8, 32, torch.float16)
    slots, positions = torch.tensor([2]), torch.arange(590, 596)[None]
    clean = invariant_attention.attend(q, k, v, slots, positions, 250, 0.2, None, split)
    k[2, :320], v[2, :320] = float("nan"), float("nan")
    assert torch.equal(invariant_attention.attend(q, k, v, slots, positions, 250, 0.2, None,
                                                  split), clean)
    ref = invariant_attention.reference(q, k, v, slots, positions, 250, 0.2, None)
    assert (clean.float() - ref).abs().max().item() < 2e-3


def record_launches(monkeypatch) -> list[tuple[str, tuple]]:
    """The kernel's launches from here on: ("attention" or "merge", grid) each."""
    launched = []
    kernels = invariant_attention._build()
    monkeypatch.setattr(invariant_attention, "_kernel", tuple(
        Recording(k, lambda grid, kw, name=name: launched.append((name, grid)))
        for k, name in zip(kernels, ("attention", "merge"))))
    return launched


def test_small_calls_split_their_keys(monkeypatch):
    """Where rows x KV heads x query tiles are fewer than the GPU's processors, the call runs a
    program per split and merges; where they are not, the cache holds one split, or the
    splits' states would take more than PART_BYTES, it does not."""
    launched = record_launches(monkeypatch)
    monkeypatch.setattr(invariant_attention, "_processors", lambda device: 20)
    k, v = cache(2, 32, torch.float16, length=600)

    def run(b, t):
        launched.clear()
        invariant_attention.attend(queries(b, t, 8, 32, torch.float16), k, v,
                                   torch.arange(b) % 4, torch.arange(500, 500 + t).expand(b, t),
                                   0, 0.2, None)
        return launched[:]
    assert run(1, 1) == [("attention", (3, 2, 1)), ("merge", (1, 2, 1))]   # 3 splits of 256
    assert run(4, 9) == [("attention", (3, 2, 4))]   # 3 tiles x 2 KV heads x 4 rows = 24
    short, _ = cache(2, 32, torch.float16, length=200)
    launched.clear()
    invariant_attention.attend(queries(1, 1, 8, 32, torch.float16), short, short,
                               torch.tensor([0]), torch.tensor([[150]]), 0, 0.2, None)
    assert launched == [("attention", (1, 2, 1))]
    # splits' states past PART_BYTES (1 row x 2 KV heads x 3 splits x 4 queries x 34 floats)
    monkeypatch.setattr(invariant_attention, "PART_BYTES", 2 * 3 * 4 * 34 * 4 - 1)
    assert run(1, 1) == [("attention", (1, 2, 1))]


def test_no_queries():
    k, v = cache(2, 32)
    out = invariant_attention.attend(queries(0, 1, 4, 32), k, v, torch.zeros(0, dtype=torch.long),
                                     torch.zeros(0, 1, dtype=torch.long), 0, 0.2, None)
    assert out.shape == (0, 1, 4, 32)


def test_probe_passes_and_is_remembered(monkeypatch):
    assert invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    calls = []
    monkeypatch.setattr(invariant_attention, "_check", lambda *a: calls.append(a))
    assert invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    assert calls == []
    k, v = cache(2, 32, torch.float16)
    assert invariant_attention.ready(queries(1, 1, 8, 32, torch.float16), k, None)
    assert not invariant_attention.ready(queries(1, 1, 8, 32, torch.float16), k, 30.0)


def test_a_kernel_that_depends_on_the_call_is_refused(monkeypatch, caplog):
    real = invariant_attention.attend

    def leaky(q, *args, **kw):   # every query moved by how many tokens its call holds
        return real(q, *args, **kw) + q.shape[1] * 1e-3
    monkeypatch.setattr(invariant_attention, "attend", leaky)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    assert "differs from itself alone" in caplog.text and "padded" in caplog.text


def test_a_split_that_changes_the_bits_is_refused(monkeypatch, caplog):
    real = invariant_attention.attend

    def split_apart(*args, split=None):   # the split form's merge off by a rounding
        out = real(*args, split=split)
        return out * (1 + 2 ** -10) if split else out
    monkeypatch.setattr(invariant_attention, "attend", split_apart)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    assert "split keys give other bits" in caplog.text


def test_a_wrong_kernel_is_refused(monkeypatch, caplog):
    real = invariant_attention.attend
    monkeypatch.setattr(invariant_attention, "attend", lambda *a, **kw: real(*a, **kw) * 1.1)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    assert "against plain attention" in caplog.text


def test_no_triton_keeps_the_padded_calls(monkeypatch, caplog):
    without_triton(invariant_attention, monkeypatch)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    assert "No module named 'triton'" in caplog.text


def test_prepare_probes_only_16_bit_cuda(monkeypatch):
    probed = []
    monkeypatch.setattr(invariant_attention, "probe", lambda *a: probed.append(a))
    invariant.prepare_attention(2, 4, 32, torch.float16, CPU, None)
    invariant.prepare_attention(2, 4, 32, torch.float32, torch.device("cuda"), None)
    assert probed == []


def test_an_engine_on_the_kernel_stays_exact(tmp_path, monkeypatch):
    """The invariant engine with its attention on the kernel (probed here for the CPU, which
    serving never does, and the CPU's own kernels off, which would serve in its place), two rows
    batched: speculative greedy output equals target-only's, and
    target-only's equals the plain engine's (SDPA), greedy and by seeded sampling (these random
    weights' greedy text repeats one token; a sample follows the whole distribution: a kernel
    ignoring Gemma 2's window changes it). With 64-key splits over a 72-token prompt, and
    processors for two rows' programs but not one's, the calls take both forms as the batch
    changes. Gemma 2's shape: grouped queries, capped scores, layer 0 in a window of 8 and
    layer 1 global."""
    monkeypatch.setattr(invariant_attention, "SPLIT", 64)
    monkeypatch.setattr(invariant_attention, "_processors", lambda device: 3)
    target_dir = make_checkpoint(tmp_path / "target", "gemma2")
    draft_dir = make_draft(target_dir, tmp_path / "draft", noise=0.5)
    model = load_model(str(target_dir), torch.float32, CPU)
    a = model.args
    assert invariant_attention.probe(a.num_kv_heads, a.num_heads // a.num_kv_heads, a.head_dim,
                                     torch.float32, CPU, a.attn_softcap)
    draft = Engine(load_model(str(draft_dir), torch.float32, CPU), 8, 96, CPU)
    prompts = [[(i * 37 + 11) % 97 for i in range(72)], [7, 3]]

    def run(target, k, sampling=SamplingParams()):
        return [r[0] for r in generate(target, draft, [Request(p, n, k, sampling) for p, n in
                                                       zip(prompts, (10, 16))])]
    sdpa = Engine(load_model(str(target_dir), torch.float32, CPU), 8, 96, CPU, cpu_kernel=False)
    seeded = SamplingParams(temperature=1.0, seed=11)
    plain, sampled = run(sdpa, 0), run(sdpa, 0, seeded)
    launched = record_launches(monkeypatch)
    target = Engine(model, 8, 96, CPU, batch_invariant=True, cpu_kernel=False)
    assert run(target, 0) == plain and [len(t) for t in plain] == [10, 16]
    assert run(target, 0, seeded) == sampled
    merged = sum(name == "merge" for name, _ in launched)
    assert 0 < merged < len(launched) - merged   # split calls, and calls by tile
    assert run(target, 3) == plain


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv,g,d,softcap", [(8, 4, 128, None), (4, 2, 256, 50.0)])
def test_cuda_kernel_passes_its_probe_at_real_shapes(kv, g, d, softcap):
    """On the GPU, compiled: what a load finds at Llama-3.1-8B's attention and Gemma 2's
    (head dim 256, softcap) in bfloat16 (a failure here is a fallback when serving), and both
    forms giving the same bits across a split's end."""
    cuda = torch.device("cuda")
    assert invariant_attention.probe(kv, g, d, torch.bfloat16, cuda, softcap)
    k, v = (t.to(cuda, torch.bfloat16) for t in cache(kv, d, length=600))
    q = queries(3, 5, kv * g, d).to(cuda, torch.bfloat16)
    slots, positions = torch.tensor([1, 3, 0], device=cuda), \
        torch.arange(250, 265, device=cuda).view(3, 5)
    assert invariant_attention.ready(q, k, softcap)
    tiled, split = (invariant_attention.attend(q, k, v, slots, positions, 0, d ** -0.5, softcap,
                                               s) for s in (False, True))
    assert torch.equal(tiled, split)
    ref = invariant_attention.reference(q, k, v, slots, positions, 0, d ** -0.5, softcap)
    assert (tiled.float() - ref).abs().max().item() < 2 ** -5
