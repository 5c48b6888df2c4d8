"""A trained EAGLE-3 head for a tiny target, in the speculators format, trained once a process."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from specdec.distill import data, eagle3
from specdec.eagle.checkpoint import save_speculators
from specdec.engine import Engine
from specdec.weights import load_model

SEQUENCES, NEW_TOKENS, STEPS = 512, 48, 400
# (target, steps, seed) -> a head trained in this process: a minute and a half of one core on
# the CI machine, and several modules train the same one (the session's pair_dir target).
_trained: dict[tuple[str, int, int], Path] = {}


def trained_head_dir(target_dir: Path, out_dir: Path, steps: int = STEPS, seed: int = 0) -> Path:
    """Trains a head for the target at `target_dir` (e.g. make_checkpoint(dir,
    "llama3_gqa_tied")) on SEQUENCES of its own continuations of random prompts, half greedy and
    half sampled, and writes it to `out_dir` (speculators format, float32, without the target's
    embedding). On the tiny llama3_gqa_tied target its greedy acceptance at K=4 is about 0.25 on
    held-out greedy continuations (0.32 at the first draft position). Deterministic for a seed."""
    out_dir = Path(out_dir)
    if (out_dir / "config.json").is_file():
        return out_dir
    key = (str(Path(target_dir).resolve()), steps, seed)
    if key in _trained and (_trained[key] / "config.json").is_file():
        shutil.copytree(_trained[key], out_dir)   # the same bytes: training is deterministic
        return out_dir
    threads = torch.get_num_threads()
    # A small vocabulary's shapes gain nothing from a second thread; a larger one's LM head does.
    large = json.loads((Path(target_dir) / "config.json").read_text())["vocab_size"] > 1024
    torch.set_num_threads(min(threads, 2) if large else 1)
    try:
        model = load_model(target_dir, torch.float32, "cpu")
        vocab = model.args.vocab_size
        gen = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(0, vocab, (int(n),), generator=gen).tolist()
                   for n in torch.randint(2, 12, (SEQUENCES,), generator=gen)]
        engine = Engine(model, 64, 12 + NEW_TOKENS, torch.device("cpu"), cuda_graphs=False)
        rows, lengths = data.training_rows(engine, prompts, SEQUENCES, NEW_TOKENS, 0.5, 1.0,
                                           seed, ())
        sequences = [r[:n].tolist() for r, n in zip(rows, lengths)]
        head = eagle3.train_head(model, sequences, steps, lr=5e-3, seed=seed)
        save_speculators(head, out_dir, str(target_dir), embeddings=False,
                         verifier_architectures=_architectures(target_dir))
    finally:
        torch.set_num_threads(threads)
    _trained[key] = out_dir
    return out_dir


def _architectures(target_dir: Path) -> list[str] | None:
    return json.loads((Path(target_dir) / "config.json").read_text()).get("architectures")
