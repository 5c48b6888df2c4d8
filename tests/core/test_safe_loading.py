"""Checkpoints load without running code: pickle weights are refused with the way out, and a
tokenizer's auto_map never imports the Python file it names."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from specdec.runtime.config import CheckpointError
from specdec.serving.tokenizer import load_tokenizer
from specdec.runtime.weights import load_model
from tests.tiny_checkpoints import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_pickle_weights_are_refused_with_how_to_convert_them(tmp_path):
    ckpt = make_checkpoint(tmp_path / "ckpt", "llama3_gqa_tied")
    reference = load_model(ckpt, torch.float32, "cpu")
    state = load_file(str(ckpt / "model.safetensors"))
    torch.save(state, ckpt / "pytorch_model.bin")
    (ckpt / "model.safetensors").unlink()

    with pytest.raises(CheckpointError) as err:
        load_model(ckpt, torch.float32, "cpu")
    message = str(err.value)
    assert "pytorch_model.bin" in message and "pickle" in message

    # The message's command converts the checkpoint, and the result loads to the same model.
    command = message.split('python -c "', 1)[1].split('"', 1)[0]
    done = subprocess.run([sys.executable, "-c", command], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    converted = load_model(Path(f"{ckpt}-safetensors"), torch.float32, "cpu").state_dict()
    assert converted.keys() == reference.state_dict().keys()
    assert all(torch.equal(v, converted[k]) for k, v in reference.state_dict().items())


def test_tokenizer_auto_map_is_never_imported(tmp_path):
    src = ROOT / "models" / "default" / "target"
    for f in src.glob("tokenizer*"):
        shutil.copy(f, tmp_path / f.name)
    marker = tmp_path / "code-ran"
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", "evil.EvilTokenizer"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (tmp_path / "evil.py").write_text(
        f"open({str(marker)!r}, 'w').write('x')\n"
        "from transformers import PreTrainedTokenizerFast\n"
        "class EvilTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    tokenizer = load_tokenizer(str(tmp_path))
    assert not marker.exists(), "the checkpoint's Python code ran"
    assert type(tokenizer).__module__.startswith("transformers.")
    assert tokenizer("def f():")["input_ids"] == load_tokenizer(str(src))("def f():")["input_ids"]
