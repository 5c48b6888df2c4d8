"""The GPU fast paths, checked on the CPU: flash-attn's KV-cache kernel (through a reference of
its documented contract) and the padded, static-shape forward that CUDA graphs replay.

Neither may change a token: logits equal transformers' for every variant with ragged batches,
and speculative greedy output equals the target's own greedy output on each path.
"""
import pytest
import torch
import transformers

from specdec.runtime import attention
from specdec.runtime.engine import Engine
from specdec.runtime.graphs import GraphedForward
from specdec.runtime.batch import Batch
from specdec.records import Request
from specdec.runtime.sampling import SamplingParams
from specdec.runtime.weights import load_model
from tests.core.conftest import engines, generate
from tests.core.test_speculative_exact import MAX_TOKENS, hf_greedy, prompts  # noqa: F401
from tests.tiny_checkpoints import VARIANTS, make_checkpoint

CPU = torch.device("cpu")


def reference_flash_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, cache_batch_idx,
                                 causal, window_size, softmax_scale=None, softcap=0.0):
    """flash_attn_with_kvcache's contract: row b's k, v are written into slot cache_batch_idx[b]
    at cache_seqlens[b]; its T queries attend causally, aligned bottom-right, over the
    cache_seqlens[b] + T keys of that slot (within window_size = (left, right)); scores are
    q.k x softmax_scale (default D ** -0.5), then softcap x tanh(score / softcap) if set."""
    assert causal and cache_seqlens.dtype == torch.int32 and cache_batch_idx.dtype == torch.int32
    b, t = q.shape[:2]
    out = torch.empty_like(q)
    for row in range(b):
        slot, s = int(cache_batch_idx[row]), int(cache_seqlens[row])
        assert s + t <= k_cache.shape[1], "flash-attn would write past the cache"
        k_cache[slot, s:s + t] = k[row]
        v_cache[slot, s:s + t] = v[row]
        qpos = s + torch.arange(t)[:, None]
        kpos = torch.arange(s + t)[None, :]
        mask = kpos <= qpos
        if window_size[0] >= 0:
            mask &= kpos >= qpos - window_size[0]
        qr = q[row].transpose(0, 1)                                          # [H, T, D]
        kr, vr = (c[slot, :s + t].transpose(0, 1) for c in (k_cache, v_cache))  # [KV, L, D]
        kr = kr.repeat_interleave(qr.shape[0] // kr.shape[0], 0)
        vr = vr.repeat_interleave(qr.shape[0] // vr.shape[0], 0)
        scores = qr @ kr.transpose(-1, -2) * (softmax_scale or qr.shape[-1] ** -0.5)
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        o = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vr
        out[row] = o.transpose(0, 1)
    return out


def fast(engine: Engine, flash: bool, graphs: bool, max_batch: int = 4) -> Engine:
    if flash:
        engine.model.flash = reference_flash_with_kvcache
    if graphs:
        engine.graphs = GraphedForward(engine.model, engine.cache, max_batch, capture=False)
    return engine


PATHS = [(True, False), (False, True), (True, True)]


@pytest.mark.parametrize("flash,graphs", PATHS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_ragged_logits_match_transformers(tmp_path, variant, flash, graphs):
    path = make_checkpoint(tmp_path / variant, variant)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    engine = fast(Engine(load_model(path, torch.float32, "cpu"), 3, 64, CPU), flash, graphs)
    torch.manual_seed(2)
    seqs = [torch.randint(0, 97, (n,)) for n in (30, 21)]
    with torch.no_grad():
        want = [ref(s[None]).logits[0] for s in seqs]
    slots = [engine.pool.open(1, 0), engine.pool.open(2, 0)]
    got = [[], []]
    # Two rows of different lengths per call: a prefill, single steps, a 5-token verification.
    cuts = [(0, 12, 0, 9), (12, 13, 9, 10), (13, 18, 10, 11), (18, 30, 11, 21)]
    for a0, a1, b0, b1 in cuts:
        rows = [seqs[0][a0:a1].tolist(), seqs[1][b0:b1].tolist()]
        batch = Batch.build(rows, [a0, b0], slots, engine.cache, CPU)
        with torch.no_grad():
            logits = engine.model.logits(engine._forward(batch))
        for r, row in enumerate(rows):
            got[r].append(logits[r, :len(row)])
    for r in range(2):
        torch.testing.assert_close(torch.cat(got[r]), want[r], rtol=1e-4, atol=1e-4)
    if graphs:  # prefill rows (12 tokens) fit max_tokens too: every call went through a graph
        assert engine.graphs.graphs


@pytest.mark.parametrize("flash,graphs", PATHS)
def test_greedy_speculation_equals_target_alone(pair_dir, hf_greedy, flash, graphs):  # noqa: F811
    target, draft = engines(pair_dir)
    # Buckets up to 4: 12 concurrent rows run eagerly, 3 are padded to 4, 1 and 2 fit.
    fast(target, flash, graphs), fast(draft, flash, graphs)
    for k in (0, 8):   # target-only, and drafts over several graph buckets
        for n in (12, 3, 2, 1):
            results = generate(target, draft, [Request(p, MAX_TOKENS, k) for p in prompts()[:n]])
            assert [r[0] for r in results] == hf_greedy[:n], (k, n)
    if graphs:
        used = {b for b, _ in target.graphs.graphs} | {b for b, _ in draft.graphs.graphs}
        assert {1, 2, 4} <= used, used


@pytest.mark.parametrize("flash,graphs", PATHS)
def test_sampled_rows_equal_the_eager_path(pair_dir, flash, graphs):
    reqs = [Request(p, 16, 4, SamplingParams(temperature=0.9, top_p=0.95, seed=i))
            for i, p in enumerate(prompts(6))]
    want = [r[0] for r in generate(*engines(pair_dir), reqs)]
    target, draft = engines(pair_dir)
    got = [r[0] for r in generate(fast(target, flash, graphs), fast(draft, flash, graphs), reqs)]
    assert got == want


def test_warm_up_prepares_every_graph_a_call_can_replay(pair_dir):
    """A server's engine captures at load, never while serving: every bucket, 1..max_tokens
    tokens a row (Engine.capture_graphs)."""
    target, _ = engines(pair_dir)
    g = GraphedForward(target.model, target.cache, 4, max_tokens=6, capture=False)
    g.warm_up()
    assert set(g.graphs) == {(1, 1)}   # at construction: a forward that cannot be captured
    g.warm_up(every=True)              # fails the load; a server then captures every shape
    assert set(g.graphs) == {(b, t) for b in (1, 2, 4) for t in range(1, 7)}
    static = g.graphs[(1, 1)]
    assert static.read.tolist() == [target.cache.scratch] and static.used == 0
    slots = [target.pool.open(i, 0) for i in range(3)]
    with torch.inference_mode():   # as the engine calls it (the statics were made so)
        g(Batch.build([[5, 6, 7]] * 3, [0, 0, 0], slots, target.cache, CPU))   # (4, 3)
    assert len(g.graphs) == 18 and g.graphs[(4, 3)].used == 3


def test_padding_rows_are_reset_when_the_batch_shrinks(pair_dir):
    target, _ = engines(pair_dir)
    g = GraphedForward(target.model, target.cache, 4, capture=False)
    slots = [target.pool.open(i, 0) for i in range(4)]
    g(Batch.build([[5], [6], [7], [8]], [0, 0, 0, 0], slots, target.cache, CPU))
    g(Batch.build([[5], [6], [7]], [1, 1, 1], slots[:3], target.cache, CPU))  # same bucket
    static = g.graphs[(4, 1)]
    assert static.read.tolist() == slots[:3] + [target.cache.scratch]
    assert static.write[3].eq(target.cache.scratch).all() and static.tokens[3].eq(0).all()
    assert static.positions[:3].eq(1).all() and static.positions[3].eq(0).all()


def test_attention_choice_fails_loudly():
    assert attention.choose("auto", CPU, torch.float32) is None
    assert attention.choose("sdpa", CPU, torch.float32) is None
    with pytest.raises(ValueError, match="flash-attn"):
        attention.choose("flash", CPU, torch.bfloat16)
    with pytest.raises(ValueError, match="expected auto, sdpa or flash"):
        attention.choose("fast", CPU, torch.float32)


def test_cuda_graphs_need_cuda(pair_dir):
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device"):
        Engine(load_model(pair_dir[0], torch.float32, "cpu"), 2, 32, CPU, cuda_graphs=True)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_captured_cuda_graphs_keep_greedy_exact(pair_dir, hf_greedy):  # noqa: F811
    dev = torch.device("cuda")
    target, draft = (Engine(load_model(p, torch.float32, dev), len(prompts()), 128, dev,
                            cuda_graphs=True) for p in pair_dir)
    for k in (0, 4):
        for n in (12, 3, 1):
            results = generate(target, draft, [Request(p, MAX_TOKENS, k) for p in prompts()[:n]])
            assert [r[0] for r in results] == hf_greedy[:n], (k, n)
    assert all(g.graph is not None for g in target.graphs.graphs.values())
    assert (1, 1) in draft.graphs.graphs   # captured at load


@cuda
@pytest.mark.skipif(attention.find_flash_kernel() is None, reason="flash-attn is not installed")
def test_the_reference_matches_the_real_flash_kernel():
    torch.manual_seed(0)
    dev, dt = torch.device("cuda"), torch.bfloat16
    b, t, h, kv, d, slots, length = 3, 5, 8, 2, 64, 5, 64
    q = torch.randn(b, t, h, d, device=dev, dtype=dt)
    k, v = (torch.randn(b, t, kv, d, device=dev, dtype=dt) for _ in range(2))
    cache = [torch.randn(slots, length, kv, d, device=dev, dtype=dt) for _ in range(2)]
    seqlens = torch.tensor([0, 17, 40], dtype=torch.int32, device=dev)
    idx = torch.tensor([4, 0, 2], dtype=torch.int32, device=dev)
    # The Gemma options too: a query scale of its own and soft-capped scores.
    for window, scale, cap in (((-1, -1), None, 0.0), ((7, 0), None, 0.0), ((7, 0), 0.1, 5.0)):
        ours = [c.clone() for c in cache]
        theirs = [c.clone() for c in cache]
        want = reference_flash_with_kvcache(q, *ours, k, v, seqlens, idx, True, window, scale,
                                            cap)
        got = attention.find_flash_kernel()(q, *theirs, k=k, v=v, cache_seqlens=seqlens,
                                            cache_batch_idx=idx, causal=True, window_size=window,
                                            softmax_scale=scale, softcap=cap)
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(theirs[0], ours[0])
        torch.testing.assert_close(theirs[1], ours[1])
