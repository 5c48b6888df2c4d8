"""`specdec distill` writes a standard checkpoint directory: transformers and the project's
engine load it and compute the same logits; its report holds the measured figures."""
import json

import pytest
import torch
import transformers

from specdec.runtime.engine import Engine
from specdec.runtime.batch import Batch
from specdec.runtime.weights import load_model
from tests.core.distill_helpers import distill, report, tiny_target


# Tied embeddings and grouped-query attention; untied with q/k/v biases.
@pytest.fixture(scope="module", params=["llama3_gqa_tied", "qwen2_bias"])
def distilled(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    target = tiny_target(root / "target", request.param, tie_word_embeddings=request.param
                         == "llama3_gqa_tied")
    assert distill(target, root / "draft", "--steps", "3") == 0
    return target, root / "draft"


def test_output_loads_in_transformers_and_the_engine_with_equal_logits(distilled):
    target, out = distilled
    assert not (out / ".distill").exists()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (out / name).read_bytes() == (target / name).read_bytes()
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["dtype"] == "float32"   # the tiny targets' own dtype (the default pair's: bf16)
    assert cfg["num_hidden_layers"] == 2 and cfg["vocab_size"] == json.loads(
        (target / "config.json").read_text())["vocab_size"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    engine = Engine(load_model(out, torch.float32, "cpu"), max_sequences=1, max_len=64,
                    device=torch.device("cpu"))
    ids = torch.randint(0, cfg["vocab_size"], (1, 30), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = ref(ids).logits[0]
        batch = Batch.build([ids[0].tolist()], [0], [engine.pool.open(1, 0)], engine.cache,
                            engine.device)
        got = engine.model.logits(engine.model(batch, engine.cache))[0]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # Training moved the copied layers: the draft is not the target's first and last layers.
    target_state = transformers.AutoModelForCausalLM.from_pretrained(target).state_dict()
    assert not torch.equal(ref.state_dict()["model.layers.1.mlp.down_proj.weight"],
                           target_state["model.layers.3.mlp.down_proj.weight"])


def test_report_holds_acceptance_by_position_c_and_predicted_speedups(distilled):
    r = report(distilled[1])
    h = r["heldout"]
    assert len(h["acceptance_by_position"]) == 4 and h["prompts"] == 4
    assert all(0 <= p <= 1 for p in h["acceptance_by_position"])
    assert sorted(map(int, h["per_k"])) == [1, 2, 3, 4]
    assert h["c"] > 0 and 1 <= r["summary"]["best_k"] <= 4
    best = h["per_k"][str(r["summary"]["best_k"])]
    assert best["predicted_speedup"] == max(k["predicted_speedup"] for k in h["per_k"].values())
    # Before training, each checkpoint, the end; losses logged from the first step on.
    assert [e["step"] for e in r["history"]] == [0, 2, 3]
    assert all(e["acceptance"] for e in r["history"]) and r["history"][-1]["loss"] > 0
    assert r["draft"]["init"] == "target layers [0, 3] of 4"
    assert r["draft"]["trainable_parameters"] < r["draft"]["parameters"]   # head frozen
