"""The pair to tune, checked before anything is measured: both directories load, and the draft
speaks the target's vocabulary (the same tokenizer, or the same vocabulary size without one)."""
from __future__ import annotations

import json
from pathlib import Path

from ..runtime.config import CheckpointError, ModelArgs

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_pair(target: Path, draft: Path | None) -> tuple[ModelArgs, ModelArgs | None]:
    """(target args, draft args); CheckpointError naming the file or the mismatch."""
    t = ModelArgs.from_dir(target)
    if draft is None:
        return t, None
    d = ModelArgs.from_dir(draft)
    if any((draft / f).is_file() for f in _TOKENIZER_FILES):
        theirs, ours = _vocab(draft), _vocab(target)
        if theirs is not None and ours is not None and theirs != ours:
            differ = sum(ours.get(tok) != i for tok, i in theirs.items()) + len(
                set(ours) - set(theirs))
            raise CheckpointError(
                f"{draft}: the draft's tokenizer differs from the target's ({target}) in "
                f"{differ} of {len(ours)} tokens: a draft must share the target's vocabulary")
    elif d.vocab_size != t.vocab_size:
        raise CheckpointError(f"{draft}/config.json: vocab_size {d.vocab_size} differs from the "
                              f"target's {t.vocab_size}, and the draft has no tokenizer to check")
    return t, d


def _vocab(path: Path) -> dict[str, int] | None:
    file = path / "tokenizer.json"
    if file.is_file():
        try:
            model = json.loads(file.read_text(encoding="utf-8"))["model"]
            added = json.loads(file.read_text(encoding="utf-8")).get("added_tokens", [])
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{file}: cannot be read: {e}") from None
        vocab = model.get("vocab")
        if isinstance(vocab, list):      # unigram: [[piece, score], ...]
            vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
        if not isinstance(vocab, dict):
            return None
        return {**vocab, **{t["content"]: t["id"] for t in added}}
    from transformers import AutoTokenizer   # sentencepiece or vocab.json only
    return AutoTokenizer.from_pretrained(path, local_files_only=True).get_vocab()
