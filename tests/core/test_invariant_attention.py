"""invariant_attention's Triton kernel, without a GPU in Triton's interpreter (conftest.py): it
attends like plain softmax attention (causal, windows, softcap, grouped queries, a head dim that
is no power of two), a query's output does not depend on what else the call holds, the load
probe refuses what fails, and an engine that uses it keeps speculative greedy output exact."""
import logging

import pytest
import torch

pytest.importorskip("triton")

from specdec import invariant, invariant_attention  # noqa: E402
from specdec.engine import Engine  # noqa: E402
from specdec.records import Request  # noqa: E402
from specdec.weights import load_model  # noqa: E402
from tests.core.conftest import generate, without_triton  # noqa: E402

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
    q = queries(3, 5, kv * g, d)
    slots = torch.tensor([1, 3, 0])
    # a row within the first key block, one across three, one at the cache's end
    positions = torch.tensor([[0, 1, 2, 3, 4], [120, 121, 122, 123, 124],
                              [195, 196, 197, 198, 199]])
    got = invariant_attention.attend(q, k, v, slots, positions, window, d ** -0.5, softcap)
    ref = invariant_attention.reference(q, k, v, slots, positions, window, d ** -0.5, softcap)
    assert (got - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("window", [0, 70])
def test_a_querys_output_does_not_depend_on_the_call(window):
    k, v = cache(2, 32, torch.float16)
    q = queries(1, 6, 8, 32, torch.float16)
    positions = torch.arange(90, 96)[None]
    slot = torch.tensor([2])

    def attend(q_, slots, pos):
        return invariant_attention.attend(q_, k, v, slots, pos, window, 0.2, None)
    alone = [attend(q[:, i:i + 1], slot, positions[:, i:i + 1])[0, 0] for i in range(6)]
    # all six tokens of the row at once, beside a short row and a long one
    others = queries(2, 6, 8, 32, torch.float16, seed=7)
    together = attend(torch.cat([others[:1], q, others[1:]]), torch.tensor([0, 2, 3]),
                      torch.cat([torch.arange(6)[None], positions, torch.arange(180, 186)[None]]))
    for i in range(6):
        assert torch.equal(together[1, i], alone[i]), i


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

    def leaky(q, *args):   # every query moved by how many tokens its call holds
        return real(q, *args) + q.shape[1] * 1e-3
    monkeypatch.setattr(invariant_attention, "attend", leaky)
    with caplog.at_level(logging.WARNING, "specdec"):
        assert not invariant_attention.probe(2, 4, 32, torch.float16, CPU)
    assert "differs from itself alone" in caplog.text and "padded" in caplog.text


def test_a_wrong_kernel_is_refused(monkeypatch, caplog):
    real = invariant_attention.attend
    monkeypatch.setattr(invariant_attention, "attend", lambda *a: real(*a) * 1.1)
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


def test_an_engine_on_the_kernel_stays_exact(pair_dir, monkeypatch):
    """The invariant engine with its attention on the kernel (probed here for the CPU, which
    serving never does), two rows batched: speculative greedy output equals target-only's,
    and the kernel ran."""
    target_dir, draft_dir = pair_dir
    model = load_model(str(target_dir), torch.float32, CPU)
    a = model.args
    assert invariant_attention.probe(a.num_kv_heads, a.num_heads // a.num_kv_heads, a.head_dim,
                                     torch.float32, CPU, a.attn_softcap)
    calls = []
    real = invariant_attention.attend
    monkeypatch.setattr(invariant_attention, "attend", lambda *x: calls.append(1) or real(*x))
    target = Engine(model, 8, 96, CPU, batch_invariant=True)
    draft = Engine(load_model(str(draft_dir), torch.float32, CPU), 8, 96, CPU)
    prompts = [[1, 5, 9, 2], [7, 3]]

    def run(k):
        return [r[0] for r in generate(target, draft, [Request(p, 10, k) for p in prompts])]
    plain = run(0)
    assert calls and all(len(t) == 10 for t in plain)
    assert run(3) == plain


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kv,g,d,softcap", [(8, 4, 128, None), (4, 2, 256, 50.0)])
def test_cuda_kernel_passes_its_probe_at_real_shapes(kv, g, d, softcap):
    """On the GPU, compiled: what a load finds at Llama-3.1-8B's attention and Gemma 2's
    (head dim 256, softcap) in bfloat16 (a failure here is a fallback when serving)."""
    cuda = torch.device("cuda")
    assert invariant_attention.probe(kv, g, d, torch.bfloat16, cuda, softcap)
    k, v = (t.to(cuda, torch.bfloat16) for t in cache(kv, d))
    q = queries(3, 5, kv * g, d).to(cuda, torch.bfloat16)
    slots, positions = torch.tensor([1, 3, 0], device=cuda), \
        torch.arange(150, 165, device=cuda).view(3, 5)
    assert invariant_attention.ready(q, k, softcap)
    got = invariant_attention.attend(q, k, v, slots, positions, 0, d ** -0.5, softcap)
    ref = invariant_attention.reference(q, k, v, slots, positions, 0, d ** -0.5, softcap)
    assert (got.float() - ref).abs().max().item() < 2 ** -5
