"""`specdec distill --method pard`: the training rows see what the served pass sees, the output
is a PARD checkpoint the engine proposes from in one pass, and the options are checked."""
import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from specdec.distill import pard
from specdec.runtime.engine import Engine
from specdec.runtime.weights import load_model
from tests.core.distill_helpers import distill, report, tiny_target


def test_each_copy_of_a_training_row_sees_what_the_served_pass_sees(pair_dir):
    """Copy i's row p of one training forward equals the last row of a plain forward over the
    tokens up to p - i and i masks: the served pass (parallel_drafts.py)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(pair_dir[1], dtype=torch.float64)
    k, t, mask = 4, 9, 96
    x = torch.randint(0, 96, (1, t), generator=torch.Generator().manual_seed(2))
    ids = torch.cat([x] + [torch.full_like(x, mask)] * (k - 1), 1)
    with torch.no_grad():
        out = model(input_ids=ids, position_ids=torch.arange(t).repeat(k)[None],
                    attention_mask=pard.attention(k, t, x.device)).logits[0].view(k, t, -1)
        for i in range(k):
            for p in range(i, t):
                served = torch.cat([x[:, :p - i + 1], torch.full((1, i), mask)], 1)
                torch.testing.assert_close(out[i, p], model(served).logits[0, -1])


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny target (4096 ids, its tokenizer's 4096: the mask is a row appended), its distilled
    draft, and that draft converted."""
    root = tmp_path_factory.mktemp("pard")
    target = tiny_target(root / "target")
    assert distill(target, root / "draft", "--steps", "2") == 0
    assert distill(target, root / "pard", "--method", "pard", "--from-draft",
                   str(root / "draft"), "--steps", "4", "--pard-k", "3") == 0
    return target, root / "draft", root / "pard"


def test_a_converted_draft_proposes_in_one_pass_and_keeps_the_targets_embeddings(converted):
    target, draft, out = converted
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["pard_token"] == 4096 and cfg["vocab_size"] == 4097
    engine = Engine(load_model(out, torch.float32, "cpu"), 2, 64, torch.device("cpu"),
                    vocab_size=4096)
    assert engine.parallel is not None and engine.parallel.mask == 4096
    before, after = load_file(draft / "model.safetensors"), load_file(out / "model.safetensors")
    emb = "model.embed_tokens.weight"
    assert torch.equal(after[emb][:4096], before[emb])          # frozen: the target's
    assert not torch.equal(after[emb][4096], after[emb][:4096].float().mean(0).to(
        after[emb].dtype))                                        # the mask's row learned
    changed = [n for n in before if n != emb and not torch.equal(before[n], after[n])]
    assert any(".layers." in n for n in changed)
    r = report(out)
    assert r["method"] == "pard" and r["draft"]["init"].startswith("parallel draft converted")
    assert len(r["heldout"]["acceptance_by_position"]) == 4       # --max-k 4, a pass each
    assert r["summary"]["c_per"] == "pass" and r["summary"]["c"] > 0


@pytest.mark.parametrize("extra,message", [
    (["--pard-k", "4"], "--pard-k: not an option of --method draft"),
    (["--method", "pard", "--pard-k", "1"], "--pard-k 1: must be within 2..16"),
    (["--method", "pard", "--from-draft", "{draft}", "--layers", "2"],
     "--from-draft: the draft to convert is the start"),
    (["--method", "pard", "--from-draft", "{target}/nothing"], "not a checkpoint"),
    (["--method", "pard", "--pard-token", "5000"], "--pard-token 5000: not a token id below"),
])
def test_bad_options_are_refused_naming_them(converted, tmp_path, capsys, extra, message):
    target, draft, _ = converted
    extra = [e.format(draft=draft, target=target) for e in extra]
    assert distill(target, tmp_path / "out", "--steps", "1", *extra) == 2
    assert message in capsys.readouterr().err
