"""Benchmark workloads: text that repeats its prompt, and free generation.

- `repeating`: a held-out standard-library function (the default pair never trained on it, see
  docs/default_models.md), three blank lines, then the same function begun again: its `def`
  line (`again`) or its first half of lines (`half`). A model that copies from its context
  continues with the function's own text, which prompt lookup proposes from the prompt.
- `free`: the default pair's held-out prompts, 20-60 tokens of code to continue.
- `prose`: out-of-domain text, AIPerf-style synthetic prompts: a fixed number of tokens cut at
  random offsets from English prose the default pair never trained on (the running
  interpreter's LICENSE.txt: local, nothing is downloaded; the pair was trained on `.py` files
  only). Written to a file of your choice, not committed:

    .venv/bin/python benchmarks/workloads.py --workload prose --out reports/prose_prompts.jsonl

Functions of 40-100 tokens keep prompt and 64 new tokens within the 256-token windows the
default pair was trained on. The choice is a function of the seed and the running
interpreter's standard library (the held-out split of scripts/make_default_models.py);
`repeating_prompts.jsonl` beside this file was written with Python 3.11.7:

    .venv/bin/python benchmarks/workloads.py [--seed 0] [--n 32] [--out FILE]
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import random
import sys
import sysconfig
import textwrap
from pathlib import Path

from inputs import DEFAULT_PROMPTS, DEFAULT_TARGET, ROOT, load_tokenizer

REPEATING = Path(__file__).resolve().parent / "repeating_prompts.jsonl"
WORKLOADS = {"repeating": REPEATING, "free": DEFAULT_PROMPTS}
KINDS = ("again", "half")
MIN_TOKENS, MAX_TOKENS = 40, 100


def functions(files: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """(where, source) of every function and method, dedented, in file and line order."""
    out = []
    for path, text in files:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                src = textwrap.dedent("".join(lines[node.lineno - 1:node.end_lineno]))
                out.append((f"{path}:{node.lineno}", src.rstrip("\n")))
    return sorted(out)


def repeat_prompt(source: str, kind: str) -> str:
    lines = source.splitlines(keepends=True)
    again = lines[0] if kind == "again" else "".join(lines[:max(1, len(lines) // 2)])
    # Cut at the end of a line, as the held-out prompts are: the model writes the newline and
    # indentation token itself.
    return f"{source}\n\n\n{again.rstrip()}"


def load_stdlib() -> tuple[list, list]:
    """scripts/make_default_models.py's (train, held-out) split of the standard library: a
    script, not an installed module, so loaded from its file."""
    spec = importlib.util.spec_from_file_location(
        "make_default_models", ROOT / "scripts" / "make_default_models.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script.load_stdlib()


def repeating(tokenizer, seed: int, n: int) -> list[dict]:
    _, heldout = load_stdlib()
    fits = [(where, src) for where, src in functions(heldout)
            if MIN_TOKENS <= len(tokenizer(src)["input_ids"]) <= MAX_TOKENS]
    if len(fits) < n:
        raise SystemExit(f"{len(fits)} held-out functions of {MIN_TOKENS}-{MAX_TOKENS} tokens, "
                         f"--n asks for {n}")
    rng = random.Random(seed)
    return [{"prompt": repeat_prompt(src, KINDS[i % len(KINDS)]), "kind": KINDS[i % len(KINDS)],
             "source": where} for i, (where, src) in enumerate(rng.sample(fits, n))]


PROSE_TOKENS = 100


def prose_corpus() -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"


def prose(tokenizer, seed: int, n: int, tokens: int = PROSE_TOKENS) -> list[dict]:
    """n prompts of `tokens` tokens each, cut at random token offsets from prose_corpus()."""
    corpus = prose_corpus()
    if not corpus.is_file():
        raise SystemExit(f"{corpus}: not found (this interpreter ships no LICENSE.txt); "
                         f"use another --workload")
    ids = tokenizer(" ".join(corpus.read_text().split()))["input_ids"]
    if len(ids) < 2 * tokens:
        raise SystemExit(f"{corpus}: {len(ids)} tokens, too short for {tokens}-token prompts")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        at = rng.randrange(len(ids) - tokens)
        rows.append({"prompt": tokenizer.decode(ids[at:at + tokens]),
                     "source": f"{corpus.name}@{at}"})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("repeating", "prose"), default="repeating")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--tokenizer", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--out", type=Path, default=REPEATING)
    args = ap.parse_args(argv)
    tokenizer = load_tokenizer(args.tokenizer)
    if args.workload == "prose":
        if args.out == REPEATING:
            raise SystemExit("--workload prose: name its file with --out")
        rows = prose(tokenizer, args.seed, args.n)
    else:
        rows = repeating(tokenizer, args.seed, args.n)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.out}: {len(rows)} prompts", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
