"""Prompt sets and the per-request sampling mix for the load test.

Kept free of locust and gevent so it can be imported (and tested) on its own.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_PROMPTS = ROOT / "models" / "default" / "heldout_prompts.jsonl"

# Used when no prompt file is given and the default pair's held-out prompts are absent.
BUILTIN_PROMPTS: tuple[str, ...] = (
    "def fibonacci(n):\n",
    "import os\n\n\ndef list_files(path):\n",
    "class Queue:\n    \"\"\"A FIFO queue.\"\"\"\n\n    def __init__(self):\n",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
    "    for i, line in enumerate(lines):\n        if ",
    "def read_json(path):\n    with open(path",
    "class Stack:\n    def push(self, item):\n",
    "def merge_sorted(a, b):\n    \"\"\"Merge two sorted lists.\"\"\"\n",
    "try:\n    import json\nexcept ImportError:\n",
    "def __repr__(self):\n        return ",
    "    def __enter__(self):\n        return self\n\n    def __exit__(self, ",
    "if __name__ == \"__main__\":\n",
)


def _prompt_of(obj: object, where: str) -> str:
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict):
        for key in ("prompt", "text_input", "text"):
            if isinstance(obj.get(key), str):
                return obj[key]
    raise ValueError(f"{where}: expected a string or an object with a 'prompt' string")


def load_prompts(path: str | Path | None = None, limit: int = 0, max_chars: int = 0) -> list[str]:
    """The prompt set.

    ``path``: a .jsonl file (one JSON string, or object with ``prompt``/``text_input``, per
    line) or a .json file holding a list of those. None or "" means the default pair's
    held-out prompts when present, else the built-in code prompts; "builtin" forces the
    built-in list. ``limit`` keeps the first N, ``max_chars`` keeps the last N characters of
    each prompt (the end is what the model continues); 0 disables either.
    """
    if path in (None, ""):
        path = DEFAULT_PROMPTS if DEFAULT_PROMPTS.is_file() else "builtin"
    if str(path) == "builtin":
        prompts = list(BUILTIN_PROMPTS)
    else:
        p = Path(path)
        text = p.read_text(encoding="utf-8")
        if p.suffix == ".json":
            items = json.loads(text)
            if not isinstance(items, list):
                raise ValueError(f"{p}: expected a JSON list of prompts")
            prompts = [_prompt_of(o, f"{p}[{i}]") for i, o in enumerate(items)]
        else:
            prompts = [_prompt_of(json.loads(line), f"{p}:{n}")
                       for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if limit > 0:
        prompts = prompts[:limit]
    if max_chars > 0:
        prompts = [s[-max_chars:] for s in prompts]
    prompts = [s for s in prompts if s]
    if not prompts:
        raise ValueError(f"no prompts in {path}")
    return prompts


def parse_k_list(value: str, name: str) -> list[int | None]:
    """'auto,4,0' -> [None, 4, 0]: K values, `auto` (None) leaving the choice to the server."""
    words = [v for v in str(value).replace(" ", "").split(",") if v != ""]
    if not words:
        raise ValueError(f"{name}: expected comma-separated integers >= 0 or auto, got {value!r}")
    return [None if w == "auto" else parse_int_list(w, name)[0] for w in words]


def parse_int_list(value: str, name: str, lo: int = 0) -> list[int]:
    """'4' or '4,0' -> [4] / [4, 0]; every value must be an int >= lo."""
    try:
        values = [int(v) for v in str(value).replace(" ", "").split(",") if v != ""]
    except ValueError:
        raise ValueError(f"{name}: expected comma-separated integers, got {value!r}") from None
    if not values or any(v < lo for v in values):
        raise ValueError(f"{name}: expected comma-separated integers >= {lo}, got {value!r}")
    return values


@dataclass(frozen=True)
class RequestPlan:
    """What one load-test request asks for."""

    prompt: str
    num_draft_tokens: int | None     # None: auto, the server's policy chooses per round
    max_tokens: int
    sampled: bool
    temperature: float
    top_p: float
    top_k: int
    seed: int
    cancel_after: int = 0            # the client cancels after this many pieces; 0: never

    @property
    def mode(self) -> str:
        return "sampled" if self.sampled else "greedy"


@dataclass
class Mix:
    """Draws requests: a random prompt, K cycling through the list, greedy or sampled."""

    prompts: list[str]
    draft_tokens: list[int | None]
    max_tokens: int
    sampled_ratio: float = 0.5
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 0
    rng: random.Random | None = None
    cancel_ratio: float = 0.0        # fraction of requests cancelled mid-stream (1..4 pieces in)

    def __post_init__(self) -> None:
        if not 0.0 <= self.sampled_ratio <= 1.0:
            raise ValueError(f"sampled ratio must be in [0, 1], got {self.sampled_ratio}")
        if not 0.0 <= self.cancel_ratio <= 1.0:
            raise ValueError(f"cancel ratio must be in [0, 1], got {self.cancel_ratio}")
        if self.max_tokens < 1:
            raise ValueError(f"max tokens must be >= 1, got {self.max_tokens}")
        if self.temperature <= 0:
            raise ValueError(f"the sampled requests' temperature must be > 0, got {self.temperature}")
        self.rng = self.rng or random.Random()
        self._n = 0

    def next(self) -> RequestPlan:
        # K cycles rather than being drawn, so a short run still gets an even split.
        k = self.draft_tokens[self._n % len(self.draft_tokens)]
        self._n += 1
        return RequestPlan(
            prompt=self.rng.choice(self.prompts),
            num_draft_tokens=k,
            max_tokens=self.max_tokens,
            sampled=self.rng.random() < self.sampled_ratio,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=self.rng.getrandbits(63),
            # No draw without cancellations: a seeded mix stays the one it was.
            cancel_after=(self.rng.randint(1, 4) if self.cancel_ratio
                          and self.rng.random() < self.cancel_ratio else 0),
        )
