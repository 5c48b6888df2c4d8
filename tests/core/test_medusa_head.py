"""Medusa-1 heads in FasterDecoding's layout: loading against a reference forward written here
from medusa_model.py's definition, refusals by field, `specdec distill --method medusa` (its
heads load, beat untrained heads at the first position, and the run resumes), and heads on a
real-shape target (vocabulary 32000, tied embeddings, grouped-query attention)."""
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specdec.runtime.config import CheckpointError, ModelArgs
from specdec.distill import medusa
from specdec.runtime.kv_cache import KVCache
from specdec.proposers.medusa.checkpoint import load_medusa, save_medusa
from specdec.runtime.batch import Batch
from specdec.runtime.weights import load_model
from tests.core.distill_helpers import DEFAULT_TARGET, distill, interrupt, report

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

CPU = torch.device("cpu")
H, V, K, L = 64, 1000, 3, 2
TARGET = ModelArgs(vocab_size=V, hidden_size=H, intermediate_size=128, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=16, rms_norm_eps=1e-5,
                   max_position_embeddings=256)
# Small, and enough for every stage: trained heads beat the initial ones by far at position 1.
RUN = ["--method", "medusa", "--lr", "1e-2", "--steps", "10", "--checkpoint-every", "5",
       "--gen-sequences", "16", "--gen-tokens", "24", "--eval-prompts", "8",
       "--eval-tokens", "24", "--batch", "4"]

pytestmark = pytest.mark.usefixtures("one_thread")


def published(path: Path, heads=K, layers=L, hidden=H, vocab=V, seed=0, **config) -> Path:
    """A heads directory as FasterDecoding's trainer writes it: MedusaConfig's fields only,
    float16 weights named by the heads' nn.ModuleList."""
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for i in range(heads):
        for j in range(layers):
            tensors[f"{i}.{j}.linear.weight"] = torch.randn(hidden, hidden, generator=g) * 0.1
            tensors[f"{i}.{j}.linear.bias"] = torch.randn(hidden, generator=g) * 0.1
        tensors[f"{i}.{layers}.weight"] = torch.randn(vocab, hidden, generator=g) * 0.1
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.half() for k, v in tensors.items()}, str(path / "medusa_lm_head.safetensors"))
    cfg = {"base_model_name_or_path": "lmsys/vicuna-7b-v1.3", "medusa_num_heads": heads,
           "medusa_num_layers": layers, "transformers_version": "4.31.0", **config}
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def reference(path: Path, hidden: torch.Tensor) -> torch.Tensor:
    """medusa_model.py's forward, by hand: per head x + SiLU(W x + b) per block, then x W_lm^T."""
    w = {k: v.double() for k, v in load_file(str(path / "medusa_lm_head.safetensors")).items()}
    cfg = json.loads((path / "config.json").read_text())
    out = []
    for i in range(cfg["medusa_num_heads"]):
        x = hidden.double()
        for j in range(cfg["medusa_num_layers"]):
            z = x @ w[f"{i}.{j}.linear.weight"].T + w[f"{i}.{j}.linear.bias"]
            x = x + z * torch.sigmoid(z)
        out.append(x @ w[f"{i}.{cfg['medusa_num_layers']}.weight"].T)
    return torch.stack(out, -2)


def test_published_layout_gives_the_reference_logits(tmp_path):
    path = published(tmp_path / "heads")
    head = load_medusa(path, TARGET, torch.float32, CPU)
    hidden = torch.randn(5, H, generator=torch.Generator().manual_seed(1))
    logits = head(hidden)
    assert logits.shape == (5, K, V) and logits.dtype == torch.float32
    torch.testing.assert_close(logits.double(), reference(path, hidden), rtol=0, atol=1e-4)
    torch.testing.assert_close(head(hidden, 2), logits[:, :2])
    # written back in the same layout, read the same
    save_medusa(head, tmp_path / "again", "x")
    torch.testing.assert_close(load_medusa(tmp_path / "again", TARGET, torch.float32, CPU)(hidden),
                               logits, rtol=0, atol=0)


def _pickled(path: Path) -> Path:
    published(path)
    state = load_file(str(path / "medusa_lm_head.safetensors"))
    (path / "medusa_lm_head.safetensors").unlink()
    torch.save(state, path / "medusa_lm_head.pt")
    return path


def _edit_weights(path: Path, drop=(), add=None) -> Path:
    file = path / "medusa_lm_head.safetensors"
    state = {k: v for k, v in load_file(str(file)).items() if k not in drop}
    save_file({**state, **(add or {})}, str(file))
    return path


@pytest.mark.parametrize("make,message", [
    (lambda p: published(p, hidden=32), "medusa_lm_head.safetensors: 0.0.linear.weight has shape "
     "(32, 32): hidden size 32 does not fit the target's hidden_size 64"),
    (lambda p: published(p, vocab=999), "medusa_lm_head.safetensors: 0.2.weight has shape "
     "(999, 64): vocabulary 999 does not fit the target's vocab_size 1000"),
    (lambda p: published(p, hidden_size=4096), "config.json: hidden_size 4096 does not fit the "
     "target's hidden_size 64"),
    (lambda p: published(p, vocab_size=32000), "config.json: vocab_size 32000 does not fit the "
     "target's vocab_size 1000"),
    (lambda p: _edit_weights(published(p), drop=["1.0.linear.bias"]),
     "missing tensors ['1.0.linear.bias'] that config.json's medusa_num_heads 3 and "
     "medusa_num_layers 2 imply"),
    (lambda p: published(p, heads=4, medusa_num_heads=3), "unexpected tensors ['3.0.linear.bias', "
     "'3.0.linear.weight', '3.1.linear.bias', '3.1.linear.weight', '3.2.weight']: the file holds "
     "4 heads of 2 blocks, config.json's medusa_num_heads 3"),
    (lambda p: published(p, medusa_num_layers=1), "unexpected tensors"),
    (lambda p: published(p, medusa_num_heads=0), "config.json: medusa_num_heads 0 must be an "
     "integer within 1..16"),
    (lambda p: published(p, medusa_num_layers="1"), "medusa_num_layers '1' must be an integer"),
    (lambda p: (published(p), (p / "config.json").write_text('{"architectures": ["X"]}'))[0],
     "not Medusa heads: no medusa_num_heads"),
    (_pickled, "medusa_lm_head.pt: Medusa heads in pickle format are refused"),
])
def test_refused_by_field(tmp_path, make, message):
    path = make(tmp_path / "heads")
    with pytest.raises(CheckpointError) as e:
        load_medusa(path, TARGET, torch.float32, CPU)
    assert message in str(e.value)


def test_the_pickle_refusal_says_how_to_convert(tmp_path):
    path = _pickled(tmp_path / "heads")
    with pytest.raises(CheckpointError) as e:
        load_medusa(path, TARGET, torch.float32, CPU)
    command = re.search(r'python -c "(.*)"$', str(e.value)).group(1)
    exec(command, {})   # what the user runs once, on a machine they trust
    head = load_medusa(path, TARGET, torch.float32, CPU)
    hidden = torch.randn(2, H)
    torch.testing.assert_close(head(hidden).double(), reference(path, hidden), rtol=0, atol=1e-4)


def test_distilled_heads_load_and_beat_untrained_ones(tmp_path, monkeypatch):
    """Interrupted after step 7 (checkpoint at 5 kept, two steps saved on the way out), then
    resumed to step 10: the written heads load for the target, and at the first position they
    are accepted far more often than the initial heads (blocks at identity, LM heads the
    target's: they guess the token the target has just given)."""
    out = tmp_path / "heads"
    assert interrupt(DEFAULT_TARGET, out, tuple(RUN), "interrupt:7", monkeypatch) == \
        ["step-0000007"]
    assert distill(DEFAULT_TARGET, out, *RUN) == 0
    head = load_medusa(out, ModelArgs.from_dir(DEFAULT_TARGET), torch.float32, CPU)
    assert head.args.num_heads == 4 and head.args.num_layers == 1
    r = report(out)
    assert r["method"] == "medusa" and [h["step"] for h in r["history"]] == [0, 5, 7, 10]
    assert r["history"][2].get("interrupted") and len(r["training"]["final_loss_by_head"]) == 4
    before = r["history"][0]["acceptance"]["acceptance_by_position"][0]
    after = r["heldout"]["acceptance_by_position"][0]
    assert after > max(2 * before, before + 0.05), (before, after)
    s = r["summary"]
    assert sorted(r["heldout"]["per_k"]) == ["1", "2", "3", "4"]   # K <= the heads
    assert s["pays"] == (s["predicted_speedup_best_k"] > 1) and s["c"] > 0
    assert len(s["head_top1"]) == 4


@pytest.mark.parametrize("extra,message", [
    (["--medusa-heads", "2"], "--medusa-heads: not an option of --method draft"),
    (["--method", "medusa", "--ttt-steps", "2"], "--ttt-steps: not an option of --method medusa"),
    (["--method", "medusa", "--medusa-heads", "0"], "--medusa-heads 0: must be within 1..16"),
])
def test_options_refused_by_name(capsys, tmp_path, extra, message):
    assert distill(DEFAULT_TARGET, tmp_path / "o", *extra) == 2
    assert message in capsys.readouterr().err


def test_heads_on_a_real_shape_target(tmp_path):
    """Llama 3.2 1B's config scaled to one layer of width 256 (4 query heads on 1 KV head, tied
    embeddings), vocabulary 32000: heads start from its LM head, are written in bfloat16, load,
    and read its final hidden state; head logits equal the reference forward's."""
    cfg = make_random_pair.scaled(make_random_pair.PRESETS["llama-1b"], 0.0625, 32000)
    make_random_pair.write_model(tmp_path / "target", cfg, make_random_pair.DEFAULT_TARGET, 0,
                                 2**31, None, None)
    model = load_model(tmp_path / "target", torch.float32, CPU)
    a = model.args
    assert a.vocab_size == 32000 and a.tie_word_embeddings and a.num_heads > a.num_kv_heads
    heads = medusa.new_heads(model, 3, 1, seed=0)
    with torch.no_grad():
        for p in heads.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    save_medusa(heads, tmp_path / "heads", str(tmp_path / "target"), torch.bfloat16)
    assert load_file(str(tmp_path / "heads" / "medusa_lm_head.safetensors"))[
        "2.1.weight"].dtype == torch.bfloat16
    served = load_medusa(tmp_path / "heads", a, torch.float32, CPU)
    cache = KVCache(a.num_layers, 1, 32, a.num_kv_heads, a.head_dim, torch.float32, CPU)
    with torch.no_grad():
        hidden = model(Batch.build([[1, 2, 3, 4, 5]], [0], [0], cache, CPU), cache)[:, -1]
    logits = served(hidden)
    assert logits.shape == (1, 3, 32000) and torch.isfinite(logits).all()
    torch.testing.assert_close(logits.double(), reference(tmp_path / "heads", hidden),
                               rtol=0, atol=1e-4)
