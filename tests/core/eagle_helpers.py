"""A trained EAGLE-3 head for a tiny target, in the speculators format, trained once a process,
or copied from tests/fixtures where one was trained for the same target's weights.

    .venv/bin/python -m tests.core.eagle_helpers    # rewrites tests/fixtures/eagle3_head
"""
from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from specdec.distill import data, eagle3
from specdec.proposers.eagle.checkpoint import save_speculators
from specdec.runtime.engine import Engine
from specdec.runtime.weights import load_model

SEQUENCES, NEW_TOKENS, STEPS = 512, 48, 400
BATCH = 8   # train_head's default batch
# (target, steps, seed) -> a head trained in this process: half a minute of one core on the CI
# machine, and several modules train the same one (the session's pair_dir target).
_trained: dict[tuple[str, int, int], Path] = {}
# The head the session's pair_dir target trains (training is deterministic), with the sha256
# of the target's weights it was trained for: a target of other weights trains its own.
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "eagle3_head"
_TRAINED_FOR = "trained_for.json"


def trained_head_dir(target_dir: Path, out_dir: Path, steps: int = STEPS, seed: int = 0) -> Path:
    """Trains a head for the target at `target_dir` (e.g. make_checkpoint(dir,
    "llama3_gqa_tied")) on SEQUENCES of its own continuations of random prompts (fewer where
    `steps` x BATCH are fewer), half greedy and half sampled, and writes it to `out_dir`
    (speculators format, float32, without the target's embedding). On the tiny llama3_gqa_tied
    target its greedy acceptance at K=4 is about 0.25 on held-out greedy continuations (0.32 at
    the first draft position). Deterministic for a seed."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    key = (str(Path(target_dir).resolve()), steps, seed)
    if key in _trained and (_trained[key] / "config.json").is_file():
        shutil.copytree(_trained[key], out_dir)   # the same bytes: training is deterministic
        return out_dir
    if _fixture_fits(target_dir, steps, seed):
        shutil.copytree(FIXTURE, out_dir, ignore=shutil.ignore_patterns(_TRAINED_FOR))
        config = json.loads((out_dir / "config.json").read_text())
        config["speculators_config"]["verifier"]["name_or_path"] = str(target_dir)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        _trained[key] = out_dir
        return out_dir
    threads = torch.get_num_threads()
    # A small vocabulary's shapes gain nothing from a second thread; a larger one's LM head does.
    large = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"] > 1024
    torch.set_num_threads(min(threads, 2) if large else 1)
    try:
        model = load_model(target_dir, torch.float32, "cpu")
        vocab = model.args.vocab_size
        gen = torch.Generator().manual_seed(seed)
        # A short run reads fewer sequences than SEQUENCES: writing more costs seconds a head.
        count = min(SEQUENCES, steps * BATCH)
        prompts = [torch.randint(0, vocab, (int(n),), generator=gen).tolist()
                   for n in torch.randint(2, 12, (count,), generator=gen)]
        engine = Engine(model, 64, 12 + NEW_TOKENS, torch.device("cpu"), cuda_graphs=False)
        rows, lengths = data.training_rows(engine, prompts, count, NEW_TOKENS, 0.5, 1.0,
                                           seed, ())
        sequences = [r[:n].tolist() for r, n in zip(rows, lengths)]
        head = eagle3.train_head(model, sequences, steps, batch=BATCH, lr=5e-3, seed=seed)
        save_speculators(head, out_dir, str(target_dir), embeddings=False,
                         verifier_architectures=_architectures(target_dir))
    finally:
        torch.set_num_threads(threads)
    _trained[key] = out_dir
    return out_dir


def _architectures(target_dir: Path) -> list[str] | None:
    return json.loads((Path(target_dir) / "config.json").read_text()).get("architectures")


def _trained_for(target_dir: Path, steps: int, seed: int) -> dict:
    weights = hashlib.sha256((Path(target_dir) / "model.safetensors").read_bytes()).hexdigest()
    return {"target_weights_sha256": weights, "steps": steps, "seed": seed,
            "sequences": SEQUENCES, "new_tokens": NEW_TOKENS}


def _fixture_fits(target_dir: Path, steps: int, seed: int) -> bool:
    if steps != STEPS or seed != 0 or not (FIXTURE / _TRAINED_FOR).is_file():
        return False
    if json.loads((FIXTURE / _TRAINED_FOR).read_text()) == _trained_for(target_dir, steps, seed):
        return True
    # Only the session's pair_dir target trains STEPS steps with seed 0.
    warnings.warn(f"{FIXTURE} was trained for other weights (another torch or transformers?): "
                  "training the head again, about 80 s; rewrite it with "
                  "`python -m tests.core.eagle_helpers`")
    return False


def write_fixture() -> None:
    """Train the head for the session's pair_dir target (tests/core/conftest.py) into FIXTURE."""
    from tests.tiny_checkpoints import make_checkpoint
    with tempfile.TemporaryDirectory() as tmp:
        target = make_checkpoint(Path(tmp) / "target", "llama3_gqa_tied")
        shutil.rmtree(FIXTURE, ignore_errors=True)
        trained_head_dir(target, FIXTURE)
        (FIXTURE / _TRAINED_FOR).write_text(json.dumps(_trained_for(target, STEPS, 0), indent=2)
                                            + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    write_fixture()
