"""Tensor parallelism (specdec/runtime/tensor_parallel/parallel.py) at degree 2 over gloo, two
processes on the CPU: greedy tokens equal degree 1's in float32, speculative (a draft model beside
the target or in its process, prompt lookup, an EAGLE-3 head or Medusa heads on rank 0) equal
target-only at degree 2, each rank holding only its slices; shapes that do not divide are refused by
name."""
import json
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from specdec.runtime.tensor_parallel import parallel
from specdec.runtime.config import CheckpointError, ModelArgs
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.checkpoint import HeadCheckpoint
from specdec.proposers.colocated import ColocatedDraft
from specdec.proposers.medusa.drafting import MedusaDrafter
from specdec.proposers.ngram import NgramProposer
from specdec.records import Proposer, Request, SamplingParams
from specdec.runtime.weights import load_model
from tests.core.conftest import generate
from tests.core.test_speculative_medusa import random_heads

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import make_random_pair  # noqa: E402

DEFAULT = ROOT / "models/default"
TARGET, DRAFT, HEAD = DEFAULT / "target", DEFAULT / "draft", DEFAULT / "eagle"
# 16 x 128 tokens through a real tritonserver: tests/e2e/test_tensor_parallel.py.
PROMPTS, MAX_TOKENS, SAMPLED_TOKENS, K = 8, 64, 24, 4
MAX_LEN = 24 + MAX_TOKENS + K + 2
CPU = torch.device("cpu")


def prompts(vocab: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(30)
    return [torch.randint(1, vocab, (int(n),), generator=gen).tolist()
            for n in torch.randint(2, 24, (PROMPTS,), generator=gen)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sampled(ps: list[list[int]], proposer: Proposer) -> list[Request]:
    return [Request(p, SAMPLED_TOKENS, K, SamplingParams(0.8, seed=7 + i), proposer=proposer)
            for i, p in enumerate(ps)]


def _rank(rank: int, world: int, port: int, target: str, draft: str | None, head: str | None,
          out: str) -> None:
    """One rank: rank 0 runs the loop through its Leader, the others follow it. Each writes
    the shapes it holds to out/rank<r>.json; rank 0 its tokens too."""
    from specdec.runtime.tensor_parallel.parallel_engine import Leader, control_group, follow
    torch.set_num_threads(1)
    tp = parallel.init(rank, world, "127.0.0.1", port, CPU, timeout_s=60)
    try:
        engine = Engine.load(target, PROMPTS, MAX_LEN, torch.float32, CPU, tp=tp,
                             head=HeadCheckpoint(head) if head else None)
        result = {"held": {n: tuple(p.shape) for n, p in
                           engine.model.named_parameters(remove_duplicate=False)}}
        # A layer packed for the CPU's kernel (cpu_linear) holds its weight in that form.
        result["held"].update({f"{n}.weight": (m.out_features, m.in_features)
                               for n, m in engine.model.named_modules()
                               if getattr(m, "packed", None) is not None})
        control = control_group()
        if rank:
            Path(out, f"rank{rank}.json").write_text(json.dumps(result))
            follow(engine, control, CPU)
            return
        leader = Leader(engine, control)
        ps = prompts(engine.model.args.vocab_size)
        result["plain"] = ids(target_only(leader, ps))
        if draft:   # the draft model at degree 1, in rank 0's process
            d = Engine(load_model(draft, torch.float32, CPU), PROMPTS, MAX_LEN, CPU)
            spec = generate(leader, d, [Request(p, MAX_TOKENS, K) for p in ps])
        else:       # prompt lookup
            spec = generate(leader, None, [Request(p, MAX_TOKENS, K, proposer=Proposer.NGRAM)
                                           for p in ps], ngram=NgramProposer())
        result["spec"], result["accepted"] = ids(spec), accepted(spec)
        if head:    # on rank 0 alone; its sampled q goes to rank 1 with each verification
            eagle = generate(leader, None, [Request(p, MAX_TOKENS, K, proposer=Proposer.EAGLE)
                                            for p in ps])
            result["eagle"], result["eagle_accepted"] = ids(eagle), accepted(eagle)
            result["eagle_sampled"] = ids(generate(leader, None, sampled(ps, Proposer.EAGLE)))
        if draft and head:   # rank 0 drafts in its own process: Medusa heads, the draft model
            leader.add_drafter(Proposer.MEDUSA, MedusaDrafter(random_heads(engine.model),
                                                              engine.vocab_size))
            leader.add_drafter(Proposer.DRAFT, ColocatedDraft(d))
            for p in (Proposer.MEDUSA, Proposer.DRAFT):
                got = generate(leader, None, [Request(q, MAX_TOKENS, K, proposer=p) for q in ps])
                result[p.value] = ids(got)
                result[f"{p.value}_drafted"] = sum(r[1].total_draft_tokens for r in got)
        leader.stop()
        Path(out, "rank0.json").write_text(json.dumps(result))
    finally:
        parallel.close()


def ids(results) -> list[list[int]]:
    return [r[0] for r in results]


def accepted(results) -> int:
    return sum(r[1].total_accepted_draft_tokens for r in results)


def target_only(engine, ps: list[list[int]]) -> list:
    return generate(engine, None, [Request(p, MAX_TOKENS, 0, proposer=Proposer.NGRAM)
                                   for p in ps], ngram=NgramProposer())


def degree_two(tmp_path: Path, target: Path, draft: Path | None,
               head: Path | None = None) -> tuple[dict, dict]:
    """Rank 0's results and rank 1's held shapes."""
    mp.spawn(_rank, args=(2, free_port(), str(target), draft and str(draft),
                          head and str(head), str(tmp_path)), nprocs=2, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        r["held"] = {n: tuple(shape) for n, shape in r["held"].items()}
    return ranks[0], ranks[1]["held"]


def degree_one(target: Path) -> list[list[int]]:
    engine = Engine(load_model(target, torch.float32, CPU), PROMPTS, MAX_LEN, CPU)
    return ids(target_only(engine, prompts(engine.model.args.vocab_size)))


def test_embedded_pair_at_degree_two_equals_degree_one(tmp_path, one_thread):
    """models/default: 8 heads and 4 KV heads (2 per rank), tied 4096-token vocabulary; its
    draft model and its EAGLE-3 head (no embedding of its own: it shares the target's, which
    rank 0 alone holds whole)."""
    two, held = degree_two(tmp_path, TARGET, DRAFT, HEAD)
    one = degree_one(TARGET)
    assert len(one) == PROMPTS and all(len(t) == MAX_TOKENS for t in one)
    assert two["plain"] == one
    assert two["spec"] == two["plain"] and two["accepted"] > 0   # the draft did speculate
    assert two["eagle"] == two["plain"] and two["eagle_accepted"] > 0
    for p in ("medusa", "draft"):   # in rank 0's process, at degree 1 over a degree-2 target
        assert two[p] == two["plain"] and two[f"{p}_drafted"] > 0, p
    # Sampled: float32 logits differ from degree 1's in the last bits at most: the same draws.
    d1 = Engine.load(str(TARGET), PROMPTS, MAX_LEN, torch.float32, CPU,
                     head=HeadCheckpoint(str(HEAD)))
    ps = prompts(d1.model.args.vocab_size)
    assert two["eagle_sampled"] == ids(generate(d1, None, sampled(ps, Proposer.EAGLE)))
    a = ModelArgs.from_dir(TARGET)
    d, half = a.head_dim, (a.vocab_size // 2, a.hidden_size)
    assert held["model.embed_tokens.weight"] == held["lm_head.weight"] == half
    assert held["model.layers.0.self_attn.qkv_proj.weight"] == (
        (a.num_heads + 2 * a.num_kv_heads) * d // 2, a.hidden_size)
    assert held["model.layers.0.mlp.down_proj.weight"] == (a.hidden_size,
                                                           a.intermediate_size // 2)
    assert two["held"]["model.embed_tokens.weight"] == (a.vocab_size, a.hidden_size)
    assert two["held"]["lm_head.weight"] == half


def test_real_shape_gqa_with_one_kv_head_replicated(tmp_path, one_thread):
    """Llama-3.1-8B's layout scaled down: 4 query heads on one KV head (each rank holds a copy of
    it), Llama 2's and Mistral 7B's 32000-token vocabulary split in two (its own 128256 passed
    too, at four times the test's time)."""
    cfg = make_random_pair.scaled(make_random_pair.PRESETS["llama-8b"], 0.0625, 32000)
    target = tmp_path / "llama"
    make_random_pair.write_model(target, cfg, make_random_pair.DEFAULT_TARGET, 0, 2**31,
                                 None, None)
    a = ModelArgs.from_dir(target)
    assert a.vocab_size >= 32000 and a.num_kv_heads == 1 < a.num_heads
    two, held = degree_two(tmp_path, target, None)
    assert two["plain"] == degree_one(target)
    assert two["spec"] == two["plain"]
    assert held["model.layers.0.self_attn.qkv_proj.weight"] == (
        (a.num_heads // 2 + 2) * a.head_dim, a.hidden_size)
    assert held["lm_head.weight"] == (a.vocab_size // 2, a.hidden_size)


def _args(**fields) -> ModelArgs:
    base = dict(vocab_size=1000, hidden_size=64, intermediate_size=96, num_layers=1,
                num_heads=8, num_kv_heads=4, head_dim=8, rms_norm_eps=1e-6,
                max_position_embeddings=64)
    return ModelArgs(**{**base, **fields})


@pytest.mark.parametrize("fields, world, words", [
    (dict(), 3, "num_attention_heads 8 is not divisible by the tensor-parallel degree 3"),
    (dict(num_heads=24, num_kv_heads=8), 3,
     "num_key_value_heads 8 neither divides nor is divisible by the tensor-parallel degree 3"),
    (dict(intermediate_size=100), 8,
     "intermediate_size 100 is not divisible by the tensor-parallel degree 8"),
])
def test_shapes_that_do_not_divide_are_refused_by_name(fields, world, words):
    with pytest.raises(CheckpointError, match=words):
        parallel.layout(_args(**fields), 0, world)


def test_layout_replicates_kv_heads_and_pads_the_vocabulary():
    places = [parallel.layout(_args(num_kv_heads=2, vocab_size=1001), r, 4) for r in range(4)]
    assert [p.heads for p in places] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    assert [p.kv_heads for p in places] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [p.vocab for p in places] == [(0, 251), (251, 502), (502, 753), (753, 1001)]
    assert {p.rows for p in places} == {251}


def test_worker_processes_follow_rank_zero_and_a_dead_rank_fails_fast(tmp_path):
    """The serving path: rank 0 here starts rank 1 as `python -m
    specdec.runtime.tensor_parallel.parallel_worker`; output equals degree 1's; a killed rank 1
    fails the next call at once, marks the engine unhealthy, and nothing hangs."""
    import time

    from specdec.runtime.tensor_parallel.parallel_engine import RankFailure
    from specdec.runtime.tensor_parallel.parallel_launch import start
    engine = dict(max_sequences=PROMPTS, max_len=MAX_LEN)
    leader = start(TARGET, [CPU, CPU], engine, torch.float32, timeout_s=30, threads=1)
    try:
        ps = prompts(leader.model.args.vocab_size)[:4]
        got = [r[0] for r in generate(leader, None, [
            Request(p, 32, 0, proposer=Proposer.NGRAM) for p in ps], ngram=NgramProposer())]
        one = Engine(load_model(TARGET, torch.float32, CPU), PROMPTS, MAX_LEN, CPU)
        assert got == [r[0] for r in generate(one, None, [
            Request(p, 32, 0, proposer=Proposer.NGRAM) for p in ps], ngram=NgramProposer())]
        assert leader.healthy
        leader.workers[0].kill()
        leader.workers[0].wait(10)
        t0 = time.monotonic()
        with pytest.raises(RankFailure, match="exited"):
            leader.release([1])
        assert time.monotonic() - t0 < 5 and not leader.healthy
        with pytest.raises(RankFailure):   # and every call after it
            leader.verify([])
    finally:
        leader.stop()
        parallel.close()


def test_a_shape_that_does_not_divide_is_refused_before_any_process_starts():
    from specdec.runtime.tensor_parallel.parallel_launch import start
    with pytest.raises(CheckpointError, match="num_attention_heads 8 is not divisible by the "
                                              "tensor-parallel degree 3"):
        start(TARGET, [CPU] * 3, dict(max_sequences=1, max_len=8), torch.float32)


def test_settings_give_the_target_one_device_per_rank(monkeypatch):
    from specdec.serving.engine_settings import EngineSettings
    from specdec.serving.settings import SettingsError
    params = {"model_path": str(TARGET)}
    monkeypatch.setenv("SPECDEC_TARGET_DEVICES", "cuda:0, cuda:1")
    s = EngineSettings.parse(params, "target")
    assert s.tensor_parallel == 2 and s.rank_devices() == [torch.device("cuda", 0),
                                                           torch.device("cuda", 1)]
    draft = EngineSettings.parse({"model_path": str(DRAFT)}, "draft")
    assert draft.tensor_parallel == 1 and draft.target_devices == ""
    monkeypatch.setenv("SPECDEC_TENSOR_PARALLEL", "4")
    with pytest.raises(SettingsError, match="tensor_parallel 4 but target_devices 'cuda:0, "
                                            "cuda:1' names 2 device"):
        EngineSettings.parse(params, "target")
    monkeypatch.delenv("SPECDEC_TARGET_DEVICES")
    monkeypatch.setenv("SPECDEC_DEVICE", "cpu")
    assert EngineSettings.parse(params, "target").rank_devices() == [CPU] * 4
    monkeypatch.setenv("SPECDEC_TENSOR_PARALLEL", "0")
    with pytest.raises(SettingsError, match="tensor_parallel 0"):
        EngineSettings.parse(params, "target")
