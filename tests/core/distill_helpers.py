"""Tiny targets with a real tokenizer, and `specdec distill` run in process with tiny settings."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from specdec import cli
from specdec.distill.train import FAULT_ENV
from tests.tiny_checkpoints import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_TARGET = ROOT / "models" / "default" / "target"
# Enough to run every stage in a second or two: 2-step checkpoints, 8 short continuations.
TINY = ["--batch", "2", "--seq-len", "32", "--gen-sequences", "8", "--gen-tokens", "8",
        "--prompt-tokens", "8", "--eval-prompts", "4", "--eval-tokens", "12", "--max-k", "4",
        "--checkpoint-every", "2", "--warmup", "2"]


def tiny_target(path: Path, variant: str = "llama3_gqa_tied", **overrides) -> Path:
    """A random 4-layer checkpoint of `variant` with the default pair's tokenizer (4096 ids)."""
    make_checkpoint(path, variant, **{"vocab_size": 4096, "num_hidden_layers": 4,
                                      "eos_token_id": 0, "bos_token_id": 0, **overrides})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(DEFAULT_TARGET / name, path / name)
    return path


def distill(target: Path, out: Path, *extra: str) -> int:
    """One torch thread: these shapes gain nothing from two, and on a shared machine every
    operator would wait for both threads to be scheduled."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return cli.main(["distill", "--target", str(target), "--out", str(out), *TINY, *extra])
    finally:
        torch.set_num_threads(threads)


def report(out: Path) -> dict:
    return json.loads((out / "distill_report.json").read_text())


def interrupt(target: Path, out: Path, args: tuple[str, ...], fault: str,
              monkeypatch) -> list[str]:
    """Run with the test fault `fault` (train.FAULT_ENV: "interrupt:N", "term:N" or "crash:N");
    returns the checkpoints it left. The fault is unset again for the rerun."""
    monkeypatch.setenv(FAULT_ENV, fault)
    if fault.startswith("crash"):
        with pytest.raises(RuntimeError, match=f"injected crash after step {fault[6:]}"):
            distill(target, out, *args)
    else:
        assert distill(target, out, *args) == 130
    monkeypatch.delenv(FAULT_ENV)
    return sorted(p.name for p in (out / ".distill").glob("step-*"))
