"""target_model at tensor-parallel degree 2 on a real tritonserver (gloo, two processes on the
CPU) serving a real-shape grouped-query pair: greedy text equals degree 1's over 8 held-out
prompts x 128 tokens, speculative (the draft model, an EAGLE-3 head on rank 0) equals
target-only at degree 2, seeded sampling is reproducible, and a killed rank 1 is recovered by the
supervisor with the same text afterwards.

The pair (`write_pair`, about 5 s): Llama 3's layout (8 query heads on 2 key/value heads, one
per rank; tied embeddings; Llama 3.1 RoPE) and Llama 2's 32000-token vocabulary, tiny otherwise
(width 128, 2 layers), with the embedded tokenizer and a chat template. Its weights are drawn
wide (tiny_checkpoints): 0.02-std weights repeat one token, which would hide a wrong logit. The
tied rows past the tokenizer's 4096 ids are zero, so the output decodes to text. The draft is the
target plus noise: it agrees on about 40% of its drafts, so rounds both accept and reject. The
head is random (make_random_pair.write_head, without an embedding of its own): it shows the
served path, not acceptance (tests/core/test_tensor_parallel.py has a trained head).

One server for all of it (the embedded pair at degree 2 is tested in process:
tests/core/test_tensor_parallel.py, tests/adapters/test_tensor_parallel_serving.py)."""
from __future__ import annotations

import os
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.runtime.engine import Engine
from specdec.proposers.ngram import NgramProposer
from specdec.records import Proposer, Request
from specdec.launcher import procs
from specdec.serving.tokenizer import decode_ids, encode_prompt, load_tokenizer
from specdec.runtime.weights import load_model
from specdec_client import GenerationParams, generate
from tests.core.conftest import generate as generate_ids
from tests.e2e.conftest import heldout_prompts, launch, templated_tokenizer, wait_for
from tests.tiny_checkpoints import make_checkpoint, make_draft

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

PROMPTS = heldout_prompts(8)   # a batch of 8 rows at degree 2; 16 doubled its 38 s
TOKENS, MAX_LEN = 128, 192
SHAPE = dict(vocab_size=32000, hidden_size=128, num_attention_heads=8, num_key_value_heads=2,
             intermediate_size=512, max_position_embeddings=256)
LIVE_IDS = 4096   # the embedded tokenizer's


def write_pair(root: Path, tokenizer: Path) -> tuple[Path, Path, Path]:
    """(target, draft, head) under root; tokenizer: a directory whose tokenizer files are
    copied."""
    target = make_checkpoint(root / "target", "llama3_gqa_tied", 0, **SHAPE)
    weights = target / "model.safetensors"
    state = load_file(weights)
    state["model.embed_tokens.weight"][LIVE_IDS:] = 0
    save_file(state, weights, metadata={"format": "pt"})
    for f in tokenizer.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, target / f.name)
    make_random_pair.write_head(root / "head", target, 2)
    return target, make_draft(target, root / "draft", noise=0.03), root / "head"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return write_pair(tmp_path_factory.mktemp("tp-pair"), templated_tokenizer(tmp_path_factory))


@pytest.fixture(scope="module")
def tp_server(tmp_path_factory, pair):
    target, draft, head = pair
    yield from launch(tmp_path_factory, {
        "SPECDEC_TARGET_MODEL": str(target), "SPECDEC_DRAFT_MODEL": str(draft),
        "SPECDEC_EAGLE_HEAD": str(head),
        "SPECDEC_TENSOR_PARALLEL": "2", "SPECDEC_MAX_SEQUENCES": str(len(PROMPTS)),
        "SPECDEC_MAX_SEQ_LEN": str(MAX_LEN), "SPECDEC_DRAFT_TIMEOUT_S": "600",
        "SPECDEC_HEALTH_INTERVAL_S": "0.5"})


def results(server, params: GenerationParams, prompts=PROMPTS) -> list:
    with ThreadPoolExecutor(len(prompts)) as pool:   # one batch: every request at once
        return list(pool.map(lambda p: generate(server.http, p, params), prompts))


def texts(server, params: GenerationParams, prompts=PROMPTS) -> list[str]:
    return [r.text for r in results(server, params, prompts)]


def greedy(k: int, tokens: int = TOKENS, proposer: str = "draft") -> GenerationParams:
    return GenerationParams(max_tokens=tokens, temperature=0.0, num_draft_tokens=k,
                            proposer=proposer)


def degree_one(target: Path) -> list[str]:
    """The target alone at degree 1 in this process, float32 as the server, tokenized and
    decoded by the server's own functions."""
    tokenizer = load_tokenizer(str(target))
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        engine = Engine(load_model(target, torch.float32, cpu), len(PROMPTS), MAX_LEN, cpu)
        out = generate_ids(engine, None, [
            Request(encode_prompt(tokenizer, p), TOKENS, 0, proposer=Proposer.NGRAM)
            for p in PROMPTS], ngram=NgramProposer())
    finally:
        torch.set_num_threads(threads)
    return [decode_ids(tokenizer, tokens) for tokens, _, _ in out]


def test_degree_two_equals_degree_one_and_speculation_equals_target_only(tp_server, pair):
    two = results(tp_server, greedy(0))
    assert [r.num_output_tokens for r in two] == [TOKENS] * len(PROMPTS)
    assert [r.text for r in two] == degree_one(pair[0])
    spec = results(tp_server, greedy(4))
    assert [r.text for r in spec] == [r.text for r in two]
    accepted = sum(r.total_accepted_draft_tokens for r in spec)
    assert 0 < accepted < sum(r.total_draft_tokens for r in spec)   # rounds accept and reject
    eagle = results(tp_server, greedy(4, proposer="eagle"), PROMPTS[:2])
    assert [r.text for r in eagle] == [r.text for r in two[:2]]
    assert all(r.total_draft_tokens > 0 for r in eagle)
    # A sampled draft's q goes to rank 1 with its verification: the draft model's from the
    # draft_model process, the head's from rank 0's engine.
    for proposer, n in (("draft", 4), ("eagle", 2)):
        seeded = GenerationParams(max_tokens=24, temperature=0.8, seed=11, num_draft_tokens=4,
                                  proposer=proposer)
        assert texts(tp_server, seeded, PROMPTS[:n]) == texts(tp_server, seeded, PROMPTS[:n])


def rank_one(server) -> int:
    """target_model's worker process (rank 1): a child of its backend process."""
    backend = server.backend_pid("target_model")
    workers = [pid for pid in procs.children(backend)
               if b"specdec.runtime.tensor_parallel.parallel_worker" in b" ".join(procs._argv(pid))]
    assert len(workers) == 1, workers
    return workers[0]


def test_killed_rank_one_is_recovered_with_exact_output(tp_server):
    before = texts(tp_server, greedy(0, 32), PROMPTS[:4])
    old = rank_one(tp_server)
    os.kill(old, signal.SIGKILL)
    # Requests fail (retryably) until the supervisor has reloaded target_model: a new rank 0
    # and a new rank 1.
    assert wait_for(lambda: _answers(tp_server), timeout=180)
    assert rank_one(tp_server) != old
    assert texts(tp_server, greedy(0, 32), PROMPTS[:4]) == before


def _answers(server) -> bool:
    try:
        return generate(server.http, PROMPTS[0], greedy(0, 1)).num_output_tokens == 1
    except Exception:   # noqa: BLE001 (down until restarted)
        return False
