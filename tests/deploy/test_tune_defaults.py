"""`specdec tune`'s default pair where the package is installed (the image): the pair the server
finds, $SPECDEC_DEFAULT_MODELS, not a models/ directory beside site-packages."""
import argparse

from specdec.serving.settings import REPO_ROOT
from specdec.tune import cli


def defaults() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    cli.add_arguments(ap)
    return ap.parse_args([])


def test_tune_defaults_to_the_pair_named_by_the_image(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_DEFAULT_MODELS", str(tmp_path))
    args = defaults()
    assert (args.target, args.draft, args.prompts) == \
        (tmp_path / "target", tmp_path / "draft", tmp_path / "heldout_prompts.jsonl")


def test_tune_defaults_to_the_checkouts_pair(monkeypatch):
    monkeypatch.delenv("SPECDEC_DEFAULT_MODELS", raising=False)
    args = defaults()
    pair = REPO_ROOT / "models" / "default"
    assert (args.target, args.draft) == (pair / "target", pair / "draft")
    assert args.target.is_dir() and args.prompts.is_file()
