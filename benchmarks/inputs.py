"""What the benchmarks run on by default: the embedded model pair and its held-out prompts."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TARGET = ROOT / "models" / "default" / "target"
DEFAULT_DRAFT = ROOT / "models" / "default" / "draft"
DEFAULT_PROMPTS = ROOT / "models" / "default" / "heldout_prompts.jsonl"


def add_pair_arguments(ap: argparse.ArgumentParser) -> None:
    """--target and --draft: checkpoint directories, the embedded pair by default."""
    ap.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--draft", type=Path, default=DEFAULT_DRAFT)


def add_server_env_argument(ap: argparse.ArgumentParser, help: str | None = None) -> None:
    """--server-env SPECDEC_KEY=VALUE, repeatable: a list of (key, value); dict() it."""
    def item(text: str) -> tuple[str, str]:
        if "=" not in text or not text.startswith("SPECDEC_"):
            raise argparse.ArgumentTypeError(f"{text!r}: expected SPECDEC_KEY=VALUE")
        key, value = text.split("=", 1)
        return key, value
    ap.add_argument("--server-env", action="append", default=[], type=item,
                    metavar="SPECDEC_KEY=VALUE", help=help)


def load_prompts(path: Path, n: int, strict: bool = True) -> list[str]:
    """The first n prompts: JSON lines with a 'prompt' field, or a text file, one per line.
    strict: fail when the file holds fewer than n."""
    prompts = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        prompts.append(json.loads(line)["prompt"] if path.suffix == ".jsonl" else line)
        if len(prompts) == n:
            break
    if len(prompts) < n and strict:
        raise SystemExit(f"{path}: {len(prompts)} prompts, --prompts asks for {n}")
    return prompts


def load_tokenizer(path: Path):
    """A checkpoint's tokenizer, with transformers' warnings and progress bars off."""
    import transformers
    from transformers import AutoTokenizer
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def prompt_ids(tokenizer_dir: Path, path: Path, n: int) -> list[list[int]]:
    """The first n prompts (or all the file has), as the checkpoint's tokenizer encodes them."""
    tok = load_tokenizer(tokenizer_dir)
    return [tok(p)["input_ids"] for p in load_prompts(path, n, strict=False)]
