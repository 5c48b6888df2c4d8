"""Tensor parallelism (specdec/parallel.py) at degree 2 over gloo, two processes on the CPU:
greedy tokens equal degree 1's in float32, speculative equal target-only at degree 2, each rank
holding only its slices; shapes that do not divide are refused by name."""
import json
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from specdec import parallel
from specdec.config import CheckpointError, ModelArgs
from specdec.engine import Engine
from specdec.ngram import NgramProposer
from specdec.records import Proposer, Request
from specdec.weights import load_model
from tests.core.conftest import generate

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import make_random_pair  # noqa: E402

TARGET, DRAFT = ROOT / "models/default/target", ROOT / "models/default/draft"
PROMPTS, MAX_TOKENS, K = 16, 128, 4
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


def _rank(rank: int, world: int, port: int, target: str, draft: str | None, out: str) -> None:
    """One rank: rank 0 runs the loop through its Leader, the others follow it."""
    from specdec.parallel_engine import Leader, control_group, follow
    from specdec.sharded_weights import load_shard
    torch.set_num_threads(1)
    tp = parallel.init(rank, world, "127.0.0.1", port, CPU, timeout_s=120)
    try:
        model = load_shard(target, torch.float32, CPU, tp)
        held = {n: tuple(p.shape) for n, p in model.named_parameters()}
        engine = Engine(model, PROMPTS, MAX_LEN, CPU)
        control = control_group()
        if rank:
            follow(engine, control, CPU)
            return
        leader = Leader(engine, control)
        ps = prompts(model.args.vocab_size)
        plain = target_only(leader, ps)
        if draft:   # the draft model at degree 1, in rank 0's process
            d = Engine(load_model(draft, torch.float32, CPU), PROMPTS, MAX_LEN, CPU)
            spec = generate(leader, d, [Request(p, MAX_TOKENS, K) for p in ps])
        else:       # prompt lookup
            spec = generate(leader, None, [Request(p, MAX_TOKENS, K, proposer=Proposer.NGRAM)
                                           for p in ps], ngram=NgramProposer())
        leader.stop()
        Path(out).write_text(json.dumps({
            "plain": [r[0] for r in plain], "spec": [r[0] for r in spec],
            "accepted": sum(r[1].total_accepted_draft_tokens for r in spec), "held": held}))
    finally:
        parallel.close()


def target_only(engine, ps: list[list[int]]) -> list:
    return generate(engine, None, [Request(p, MAX_TOKENS, 0, proposer=Proposer.NGRAM)
                                   for p in ps], ngram=NgramProposer())


def degree_two(tmp_path: Path, target: Path, draft: Path | None) -> dict:
    out = tmp_path / "rank0.json"
    mp.spawn(_rank, args=(2, free_port(), str(target), str(draft) if draft else None,
                          str(out)), nprocs=2, join=True)
    result = json.loads(out.read_text())
    result["held"] = {n: tuple(shape) for n, shape in result["held"].items()}
    return result


def degree_one(target: Path) -> list[list[int]]:
    engine = Engine(load_model(target, torch.float32, CPU), PROMPTS, MAX_LEN, CPU)
    ps = prompts(engine.model.args.vocab_size)
    return [r[0] for r in target_only(engine, ps)]


def test_embedded_pair_at_degree_two_equals_degree_one(tmp_path):
    """models/default: 8 heads and 4 KV heads (2 per rank), tied 4096-token vocabulary."""
    two = degree_two(tmp_path, TARGET, DRAFT)
    one = degree_one(TARGET)
    assert len(one) == PROMPTS and all(len(t) == MAX_TOKENS for t in one)
    assert two["plain"] == one
    assert two["spec"] == two["plain"]
    assert two["accepted"] > 0           # the draft did speculate
    a = ModelArgs.from_dir(TARGET)
    d = a.head_dim
    assert two["held"]["model.embed_tokens.weight"] == (a.vocab_size // 2, a.hidden_size)
    assert two["held"]["model.layers.0.self_attn.qkv_proj.weight"] == (
        (a.num_heads + 2 * a.num_kv_heads) * d // 2, a.hidden_size)
    assert two["held"]["model.layers.0.mlp.down_proj.weight"] == (
        a.hidden_size, a.intermediate_size // 2)


def test_real_shape_gqa_with_one_kv_head_replicated(tmp_path):
    """Llama-3.1-8B's layout scaled down: 4 query heads on one KV head (each rank holds a copy of
    it), Llama 2's and Mistral 7B's 32000-token vocabulary split in two (its own 128256 passed
    too, at four times the test's time)."""
    cfg = make_random_pair.scaled(make_random_pair.PRESETS["llama-8b"], 0.0625, 32000)
    target = tmp_path / "llama"
    make_random_pair.write_model(target, cfg, make_random_pair.DEFAULT_TARGET, 0, 2**31,
                                 None, None)
    a = ModelArgs.from_dir(target)
    assert a.vocab_size >= 32000 and a.num_kv_heads == 1 < a.num_heads
    two = degree_two(tmp_path, target, None)
    assert two["plain"] == degree_one(target)
    assert two["spec"] == two["plain"]
    assert two["held"]["model.layers.0.self_attn.qkv_proj.weight"] == (
        (a.num_heads // 2 + 2) * a.head_dim, a.hidden_size)
    assert two["held"]["lm_head.weight"] == (a.vocab_size // 2, a.hidden_size)


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
    """The serving path: rank 0 here starts rank 1 as `python -m specdec.parallel_worker`;
    output equals degree 1's; a killed rank 1 fails the next call at once, marks the engine
    unhealthy, and nothing hangs."""
    import time

    from specdec.parallel_engine import RankFailure
    from specdec.parallel_launch import start
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
    from specdec.parallel_launch import start
    with pytest.raises(CheckpointError, match="num_attention_heads 8 is not divisible by the "
                                              "tensor-parallel degree 3"):
        start(TARGET, [CPU] * 3, dict(max_sequences=1, max_len=8), torch.float32)


def test_settings_give_the_target_one_device_per_rank(monkeypatch):
    from specdec.serving.settings import EngineSettings, SettingsError
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
