"""The tokenizer of preprocessing, postprocessing and the OpenAI gateway, loaded without running
any code.

A checkpoint directory is data, never a program: `trust_remote_code` stays off, so a
tokenizer_config.json whose `auto_map` names a Python file is refused (or its class is taken
from transformers itself), never imported; and nothing is fetched from a hub.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path


def load_tokenizer(path: str, torch_free: bool = False):
    """torch_free: the caller's process never needs torch (a Triton stub of preprocessing or
    postprocessing, the OpenAI gateway). With torch installed transformers imports it: 5.5 s of
    CPU with the tokenizer on our CPUs, while every process of a starting server competes for
    the cores. Hidden, as if not installed, the same tokenizer loads in 1.8 s (transformers then
    leaves out its models, which a tokenizer does not use). Never where torch or transformers'
    models may be wanted later, tests' own processes included."""
    if torch_free and "transformers" not in sys.modules:
        sys.modules.setdefault("torch", None)    # find_spec and import then report it absent
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")   # "PyTorch was not found"
    from transformers import AutoTokenizer   # the serve extra; imported where it is needed
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


def in_triton_stub() -> bool:
    """Whether this is a Triton Python backend stub (it imports its C module at start), not a
    test's process that runs a model.py on fakes."""
    return "c_python_backend_utils" in sys.modules


def encode_prompt(tokenizer, text: str) -> list[int]:
    """A prompt's ids. A text that already begins with the BOS token (a chat template rendered to
    text, as the OpenAI gateway and Triton's own OpenAI frontend send it) gets no second one
    from a tokenizer that adds BOS itself: the ids equal apply_chat_template's."""
    ids = tokenizer(text)["input_ids"]
    bos, bos_id = tokenizer.bos_token, tokenizer.bos_token_id
    if bos and bos_id is not None and text.startswith(bos) and ids[:2] == [bos_id, bos_id]:
        return ids[1:]
    return ids


def decode_ids(tokenizer, ids: list[int]) -> str:
    """Output ids as text, as every response shows it (special tokens left out)."""
    return tokenizer.decode(ids, skip_special_tokens=True)


def stop_sequences(tokenizer, words: list[str]) -> list[list[int]]:
    """The id sequences that end a generation at `words`. Stop words match on token ids: as
    written, and as a word after a space, which byte-level and SentencePiece tokenizers spell
    with other ids."""
    def encode(t: str) -> list[int]:
        return tokenizer(t, add_special_tokens=False)["input_ids"]
    out = []
    for word in words:
        plain, spaced = encode(word), encode(" " + word)
        out += [plain] if spaced == plain or word.startswith(" ") else [plain, spaced]
    return out


def encode_request(tokenizer, text: str, words: list[str],
                   limits) -> tuple[list[int], list[int], list[int]]:
    """What preprocessing hands the orchestrator: (prompt ids, stop ids, stop lengths); a
    request over `limits` (settings.RequestLimits) is refused (InvalidInput) before the
    tokenizer runs, or right after it for the prompt's tokens."""
    from .requests import check_prompt_tokens, check_sizes
    check_sizes(text, words, limits)
    ids = encode_prompt(tokenizer, text)
    check_prompt_tokens(len(ids), limits)
    stops = stop_sequences(tokenizer, words)
    return ids, [t for s in stops for t in s], [len(s) for s in stops]


def special_ids(path: str) -> frozenset[int]:
    """The ids of the tokens a tokenizer's files mark special, which decode_ids leaves out:
    tokenizer.json's added tokens and tokenizer_config.json's added_tokens_decoder, read as
    JSON (the orchestrator loads no tokenizer). Counting an id that decode keeps costs nothing
    but a longer streaming window (detokenize.window); none where neither file lists any."""
    import json
    ids: set[int] = set()
    root = Path(path)
    if (root / "tokenizer.json").is_file():
        data = json.loads((root / "tokenizer.json").read_text(encoding="utf-8"))
        ids.update(t["id"] for t in data.get("added_tokens") or [] if t.get("special"))
    if (root / "tokenizer_config.json").is_file():
        data = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
        decoder = data.get("added_tokens_decoder") or {}
        ids.update(int(i) for i, t in decoder.items() if t.get("special"))
    return frozenset(ids)


# Files any of transformers' tokenizer classes loads a vocabulary from.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt", "spiece.model")


class TokenizerMismatch(ValueError):
    pass


def vocab_digest(vocab: dict[str, int]) -> str:
    """A short hash of a vocabulary's sorted (token, id) pairs: equal maps, equal digests."""
    import hashlib
    h = hashlib.sha256()
    for token, i in sorted(vocab.items()):
        h.update(f"{i}\t{token}\n".encode("utf-8", "surrogatepass"))
    return h.hexdigest()[:12]


def check_draft_tokenizer(draft_dir: str, tokenizer_dir: str, draft_vocab_size: int,
                          target_vocab_size: int, torch_free: bool = False) -> str:
    """Refuse a draft whose ids mean other tokens than the served tokenizer's. The draft's own
    tokenizer lives beside its weights (a Hugging Face checkpoint directory); a token both
    vocabularies hold must have one id in both, and an id both hold one token (a draft with
    fewer added tokens is served: it never proposes ids it lacks). A draft directory with no
    tokenizer files is compared by vocab_size alone. Returns a line saying what was checked.
    torch_free: load_tokenizer's (a process that loads no engine)."""
    if not any((Path(draft_dir) / f).is_file() for f in TOKENIZER_FILES):
        if draft_vocab_size != target_vocab_size:
            raise TokenizerMismatch(
                f"{draft_dir}: vocab_size {draft_vocab_size}, the target's {target_vocab_size}, "
                f"and no tokenizer files ({', '.join(TOKENIZER_FILES)}) to show the ids agree: "
                f"copy the draft's tokenizer beside its weights")
        return (f"draft {draft_dir} has no tokenizer files: only vocab_size compared "
                f"({draft_vocab_size} both)")
    draft, served = (load_tokenizer(d, torch_free).get_vocab() for d in (draft_dir, tokenizer_dir))
    by_id = {i: t for t, i in served.items()}
    moved = [(t, i, served[t]) for t, i in draft.items() if t in served and served[t] != i]
    moved += [(t, i, None) for t, i in draft.items() if t not in served and i in by_id]
    if moved:
        token, ours, theirs = min(moved, key=lambda m: m[1])
        where = f"id {theirs}" if theirs is not None else f"absent (id {ours} is {by_id[ours]!r})"
        raise TokenizerMismatch(
            f"the draft's tokenizer ({draft_dir}) maps tokens to ids differently from the "
            f"target's ({tokenizer_dir}): {len(moved)} tokens differ, first {token!r}: id {ours} "
            f"in the draft's, {where} in the target's; vocabulary digests {vocab_digest(draft)} "
            f"(draft) and {vocab_digest(served)} (target)")
    same = "the same vocabulary" if len(draft) == len(served) else \
        f"{len(draft)} of the target's {len(served)} tokens, at the same ids"
    return f"draft tokenizer {draft_dir}: {same} (digest {vocab_digest(draft)})"
