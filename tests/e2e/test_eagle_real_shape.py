"""A real-shape target (Llama 3.2 1B's config scaled down in depth and width: vocabulary 128256,
grouped-query attention, tied embeddings, Llama 3.1 RoPE; random weights whose output rows past
the tokenizer's ids are zero, so that greedy text decodes): `specdec distill --method eagle3`
runs end to end on the CPU with few steps, writes a head of the published shapes (draft
vocabulary 32000), and a real tritonserver serves it with greedy output equal to the target
alone's."""
import json
import sys
from pathlib import Path

import pytest

from specdec.runtime.config import ModelArgs
from specdec_client import GenerationParams, generate
from tests.core.distill_helpers import distill
from tests.e2e.conftest import heldout_prompts, launch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

PROMPTS = heldout_prompts(2)


@pytest.fixture(scope="module")
def target_and_head(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-shape")
    cfg = {**make_random_pair.scaled(make_random_pair.PRESETS["llama-1b"], 0.125, None),
           "num_hidden_layers": 4}
    live = make_random_pair.tokenizer_size(make_random_pair.DEFAULT_TARGET)
    make_random_pair.write_model(root / "target", cfg, make_random_pair.DEFAULT_TARGET, 0,
                                 2**31, None, None, live)
    assert distill(root / "target", root / "head", "--method", "eagle3", "--steps", "2") == 0
    return root / "target", root / "head"


@pytest.fixture(scope="module")
def server(tmp_path_factory, target_and_head):
    target, head = target_and_head
    yield from launch(tmp_path_factory, {
        "SPECDEC_TARGET_MODEL": str(target), "SPECDEC_DRAFT_MODEL": "none",
        "SPECDEC_EAGLE_HEAD": str(head), "SPECDEC_MAX_SEQUENCES": "2",
        "SPECDEC_MAX_SEQ_LEN": "256"})


def test_distilled_head_of_a_real_shape_target_is_served(server, target_and_head):
    target, head = target_and_head
    args = ModelArgs.from_dir(target)
    assert args.vocab_size == 128256 and args.tie_word_embeddings
    assert args.num_heads > args.num_kv_heads
    cfg = json.loads((head / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3" and cfg["draft_vocab_size"] == 32000
    for prompt in PROMPTS:
        plain = generate(server.http, prompt, GenerationParams(
            max_tokens=16, temperature=0.0, num_draft_tokens=0))
        assert plain.text.strip()
        for k in (3, -1):   # auto may turn a two-step head off: its text must still be equal
            got = generate(server.http, prompt, GenerationParams(
                max_tokens=16, temperature=0.0, num_draft_tokens=k, proposer="eagle"))
            assert got.text == plain.text and (k < 0 or got.total_draft_tokens > 0)
    # The head drafts beside the hosted target (the default placement): no BLS call a round.
    assert server.metric("specdec_bls_calls_per_round", proposer="eagle") == 0.0
