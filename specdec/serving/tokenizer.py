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
