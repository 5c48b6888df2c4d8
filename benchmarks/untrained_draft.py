"""A draft with a checkpoint's shape and tokenizer but untrained (randomly initialised) weights.

It never predicts the target (acceptance near 0): what speculation costs when it does not pay,
the case the adaptive draft-length policy must make harmless (docs/benchmarks.md).

    .venv/bin/python benchmarks/untrained_draft.py --like models/default/draft --out /tmp/untrained
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from inputs import DEFAULT_DRAFT

COPIED = ("generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")


def make(like: Path, out: Path, seed: int = 0) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(like, local_files_only=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(config.dtype or torch.bfloat16)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for name in COPIED:
        if (like / name).is_file():
            shutil.copy2(like / name, out / name)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--like", type=Path, default=DEFAULT_DRAFT, help="checkpoint to copy the shape of")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    print(make(args.like, args.out, args.seed))


if __name__ == "__main__":
    main()
