"""Our decoder's logits equal transformers' on the same weights, for every supported variant."""
import pytest
import torch
import transformers

from specdec.runtime.engine import Engine
from specdec.runtime.batch import Batch
from specdec.runtime.weights import load_model
from tests.tiny_checkpoints import VARIANTS, make_checkpoint


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_logits_match_transformers(tmp_path, variant):
    path = make_checkpoint(tmp_path / variant, variant)
    # eager: the one attention of transformers that has every feature (Gemma 2's capped scores)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    engine = Engine(load_model(path, torch.float32, "cpu"), max_sequences=2, max_len=64,
                    device=torch.device("cpu"))
    torch.manual_seed(1)
    ids = torch.randint(0, 97, (1, 40))
    with torch.no_grad():
        want = ref(ids).logits[0]
    # Fed in three ragged pieces through the cache, as serving does.
    got, start = [], 0
    slot = engine.pool.open(7, 0)
    for piece in (ids[0, :17].tolist(), ids[0, 17:18].tolist(), ids[0, 18:].tolist()):
        batch = Batch.build([piece], [start], [slot], engine.cache, engine.device)
        with torch.no_grad():
            got.append(engine.model.logits(engine.model(batch, engine.cache))[0])
        start += len(piece)
    torch.testing.assert_close(torch.cat(got), want, rtol=1e-4, atol=1e-4)


def test_missing_weights_named_in_error(tmp_path):
    path = make_checkpoint(tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model(path, torch.float32, "cpu")


def test_missing_directory_and_bad_config_are_named(tmp_path):
    import json
    from specdec.runtime.config import CheckpointError, ModelArgs
    with pytest.raises(CheckpointError, match="does-not-exist: model directory does not exist"):
        ModelArgs.from_dir(tmp_path / "does-not-exist")
    path = make_checkpoint(tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match=r"config.json: model_type 'gpt2' is not supported"):
        ModelArgs.from_dir(path)
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: cannot be read"):
        ModelArgs.from_dir(path)


def test_pool_that_cannot_fit_is_refused_at_load(tmp_path):
    path = make_checkpoint(tmp_path / "m")
    with pytest.raises(ValueError, match="lower max_sequences or max_seq_len"):
        Engine.load(str(path), max_sequences=10**7, max_len=256, dtype=torch.float32,
                    device=torch.device("cpu"))


def test_checkpoint_tensors_are_checked_before_fusing(tmp_path):
    """q/k/v and gate/up are concatenated at load: errors still name the checkpoint's tensors."""
    from safetensors.torch import load_file, save_file
    from specdec.runtime.config import CheckpointError
    path = make_checkpoint(tmp_path / "m")
    state = load_file(str(path / "model.safetensors"))
    k = "model.layers.1.self_attn.k_proj.weight"
    save_file({**state, k: state[k][:-1].contiguous()}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"{k} has shape"):
        load_model(path, torch.float32, "cpu")
    del state["model.layers.0.mlp.up_proj.weight"]
    save_file(state, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"missing \['model.layers.0.mlp.up_proj.weight'\]"):
        load_model(path, torch.float32, "cpu")
