"""The tokenizer of preprocessing, postprocessing and the OpenAI gateway, loaded without running
any code.

A checkpoint directory is data, never a program: `trust_remote_code` stays off, so a
tokenizer_config.json whose `auto_map` names a Python file is refused (or its class is taken
from transformers itself), never imported; and nothing is fetched from a hub.
"""
from __future__ import annotations


def load_tokenizer(path: str):
    from transformers import AutoTokenizer   # the serve extra; imported where it is needed
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)


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
