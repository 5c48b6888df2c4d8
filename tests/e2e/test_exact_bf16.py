"""Through a real tritonserver, in bfloat16 on the server's own device: greedy output of every
proposer equals the same server's target-only output, with concurrent requests batched together.

The reference is the server itself with num_draft_tokens 0, not a float32 reference computed
elsewhere, so on a GPU machine this test checks bfloat16 on CUDA (the guarantee users buy) and
here bfloat16 on the CPU. The checkpoint has a real model's shape (grouped-query attention, a
32000-id vocabulary, tied embeddings) with random weights, whose near-uniform logits make
near-ties common; the draft is the target's own checkpoint, so drafts are accepted except where
the arithmetic differs, which is where a verification that is not batch-invariant goes wrong."""
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from specdec_client import GenerationParams, generate
from tests.e2e.conftest import heldout_prompts, launch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

PROMPTS = heldout_prompts(8)
MAX_TOKENS = 48


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("bf16")
    cfg = make_random_pair.scaled(make_random_pair.PRESETS["llama-1b"], 1.0, 32000)
    cfg.update(num_attention_heads=4, num_key_value_heads=1, head_dim=32, hidden_size=128,
               num_hidden_layers=2, intermediate_size=256)
    live = make_random_pair.tokenizer_size(make_random_pair.DEFAULT_TARGET)
    make_random_pair.write_model(root / "target", cfg, make_random_pair.DEFAULT_TARGET, 0,
                                 2**31, None, None, live)
    make_random_pair.write_head(root / "head", root / "target", 1)
    yield from launch(tmp_path_factory, {
        "SPECDEC_TARGET_MODEL": str(root / "target"), "SPECDEC_DRAFT_MODEL": str(root / "target"),
        "SPECDEC_EAGLE_HEAD": str(root / "head"), "SPECDEC_DTYPE": "bfloat16",
        "SPECDEC_DEVICE": "auto", "SPECDEC_MAX_SEQUENCES": "8", "SPECDEC_MAX_SEQ_LEN": "256",
        "SPECDEC_DRAFT_TIMEOUT_S": "600"})


def run_all(server, **params) -> list[str]:
    """Every prompt at once: the server batches them, rows of mixed lengths."""
    p = GenerationParams(max_tokens=MAX_TOKENS, temperature=0.0, **params)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        return list(pool.map(lambda prompt: generate(server.http, prompt, p).text, PROMPTS))


@pytest.fixture(scope="module")
def plain(server) -> list[str]:
    """The server's target-only output, the reference of every proposer."""
    texts = run_all(server, num_draft_tokens=0)
    assert all(texts)
    return texts


@pytest.mark.parametrize("proposer,k", [("draft", 4), ("draft", -1), ("ngram", 8),
                                        ("eagle", 3), ("hybrid", -1)])
def test_every_proposer_equals_target_only_in_bfloat16(server, plain, proposer, k):
    assert run_all(server, num_draft_tokens=k, proposer=proposer) == plain
