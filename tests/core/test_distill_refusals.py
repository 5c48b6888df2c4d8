"""`specdec distill` refuses, before any work, what it cannot do, naming the path or option."""
import json

import pytest

from tests.core.distill_helpers import distill, tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("refusals") / "target")


def refused(capsys, target, out, *extra) -> str:
    capsys.readouterr()
    assert distill(target, out, *extra) == 2
    return capsys.readouterr().err


def test_missing_target_directory(capsys, tmp_path):
    missing = tmp_path / "nowhere"
    assert f"{missing}: model directory does not exist" in refused(capsys, missing, tmp_path / "o")


def test_unsupported_family(capsys, target, tmp_path):
    other = tmp_path / "gpt2"
    other.mkdir()
    cfg = json.loads((target / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    err = refused(capsys, other, tmp_path / "o")
    assert f"{other}/config.json: model_type 'gpt2' is not supported" in err


def test_target_without_tokenizer(capsys, target, tmp_path):
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        (bare / name).write_bytes((target / name).read_bytes())
    assert f"{bare}: no tokenizer.json or tokenizer.model" in refused(capsys, bare, tmp_path / "o")


def test_output_directory_not_empty(capsys, target, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    assert f"--out {out}: not empty (1 entries: notes.txt); pass --overwrite" in refused(
        capsys, target, out)
    # --overwrite replaces a checkpoint, never somebody else's files.
    err = refused(capsys, target, out, "--overwrite")
    assert "--overwrite replaces only checkpoint files, and it also holds notes.txt" in err
    assert (out / "notes.txt").read_text() == "mine"


def test_overwrite_replaces_a_previous_draft(capsys, target, tmp_path):
    out = tmp_path / "out"
    assert distill(target, out, "--steps", "0") == 0
    assert "not empty" in refused(capsys, target, out, "--steps", "0")
    (out / "model-00002-of-00002.safetensors").write_bytes(b"stale shard")
    assert distill(target, out, "--steps", "0", "--overwrite") == 0
    assert not (out / "model-00002-of-00002.safetensors").exists()


def test_draft_config_with_another_vocabulary(capsys, target, tmp_path):
    cfg = tmp_path / "draft.json"
    cfg.write_text(json.dumps({"vocab_size": 32000, "hidden_size": 32}))
    err = refused(capsys, target, tmp_path / "o", "--draft-config", str(cfg))
    assert (f"--draft-config {cfg}: vocab_size 32000 differs from the target's 4096 "
            f"({target}/config.json)") in err


def test_batch_that_does_not_fit_in_memory(capsys, target, tmp_path):
    err = refused(capsys, target, tmp_path / "o", "--batch", "100000000")
    assert "--batch 100000000 x --seq-len 32 needs about" in err
    assert "free on cpu: lower --batch or --seq-len" in err
    assert not (tmp_path / "o").exists()   # refused before anything was written


def test_resuming_with_other_options(capsys, target, tmp_path, monkeypatch):
    from specdec.distill.train import FAULT_ENV
    out = tmp_path / "o"
    monkeypatch.setenv(FAULT_ENV, "interrupt:1")
    assert distill(target, out, "--steps", "2") == 130
    monkeypatch.delenv(FAULT_ENV)
    err = refused(capsys, target, out, "--steps", "2", "--lr", "0.01")
    assert f"{out}/.distill/run.json: the interrupted run used other options (--lr" in err
