"""A user's prompts file, read once: JSON lines or plain text; errors name the file and line.

JSON lines: each line an object with "prompt" (or "text_input", as the server's input is named)
holding text, or "messages" holding a chat ([{"role": ..., "content": ...}, ...]) for the
tokenizer's chat template. Plain text: one prompt per non-empty line, "\\n" written as an escape.
"""
from __future__ import annotations

import json
from pathlib import Path


class PromptsError(ValueError):
    pass


def load_prompts(path: str | Path, limit: int | None = None) -> list[str | list[dict]]:
    """Prompts as text, or as chat messages where the file gives them."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise PromptsError(f"{path}: cannot be read: {e}") from None
    prompts: list[str | list[dict]] = []
    as_json = path.suffix in (".jsonl", ".json") or (lines and lines[0].lstrip().startswith("{"))
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompts.append(_json_prompt(path, n, line) if as_json else line.replace("\\n", "\n"))
        if limit is not None and len(prompts) == limit:
            break
    if not prompts:
        raise PromptsError(f"{path}: no prompts (empty file)")
    return prompts


def _json_prompt(path: Path, n: int, line: str) -> str | list[dict]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptsError(f"{path}:{n}: not JSON: {e.msg}") from None
    if isinstance(obj, str) and obj:
        return obj
    if isinstance(obj, dict):
        for key in ("prompt", "text_input"):
            if isinstance(obj.get(key), str) and obj[key]:
                return obj[key]
        messages = obj.get("messages")
        if (isinstance(messages, list) and messages
                and all(isinstance(m, dict) and "content" in m for m in messages)):
            return messages
    raise PromptsError(f"{path}:{n}: expected a non-empty \"prompt\", \"text_input\" or "
                       f"\"messages\" field")


def encode(tokenizer, prompt: str | list[dict]) -> list[int]:
    """Token ids of a prompt; chat messages go through the tokenizer's chat template."""
    if isinstance(prompt, str):
        return tokenizer(prompt)["input_ids"]
    if not getattr(tokenizer, "chat_template", None):
        raise PromptsError("prompts give chat messages, but the tokenizer has no chat template")
    # return_dict=False: transformers 5 returns a BatchEncoding by default, whose list() is
    # its keys.
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return list(ids["input_ids"] if isinstance(ids, dict) else ids)
