"""Streaming-safe detokenization between a stateless postprocessing step and the orchestrator.

Each streamed response carries the last few shown ids plus the new ones (`window`), and how many
of them were shown before. The text of a token list is its decode with up to three trailing
U+FFFD cut (a byte-level BPE decode ends an incomplete UTF-8 character with one), except on the
final response. Because shown text is always such a cut prefix, each piece is the new text's
difference from the old: multi-byte characters split across tokens come out whole, once.

A byte-fallback (SentencePiece) decode turns a whole run of byte tokens into U+FFFDs when the
run ends inside a character, the run's finished characters too, and a window that starts inside
a run decodes it all as U+FFFDs: there the byte tokens of an unfinished last character are left
out before the decode, and a window's leading continuation bytes (a character shown before).
"""
from __future__ import annotations

WINDOW = 8  # ids of context before the new ones: more than the at most 3 ids ever held back
MAX_WINDOW = 64  # shown ids sent at most, however many of them decode to nothing
_MAX_INCOMPLETE = 3  # bytes of a 4-byte UTF-8 character that can arrive before its last


def window(shown: list[int], new: list[int],
           special: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """Orchestrator side: (ids to send, how many of them were shown before).

    special: ids the decode leaves out (tokenizer.special_ids). The shown ids reach back to
    WINDOW of the others (at most MAX_WINDOW ids): a window of the tail of a character shown
    before and special ids alone decodes to U+FFFDs that the cut of a held-back character takes
    for one, and the tail came out again as U+FFFD."""
    start = max(0, len(shown) - WINDOW)
    if special and not special.isdisjoint(shown[start:]):
        start, kept = len(shown), 0
        while start > 0 and kept < WINDOW and len(shown) - start < MAX_WINDOW:
            start -= 1
            kept += shown[start] not in special
    return shown[start:] + new, len(shown) - start


def fallback_bytes(vocab: dict[str, int]) -> dict[int, int]:
    """A byte-fallback vocabulary's byte tokens <0x00>..<0xFF> as {id: byte}; {} where the
    vocabulary lacks any of them (byte-level BPE spells bytes as characters of their own)."""
    ids = [vocab.get(f"<0x{b:02X}>") for b in range(256)]
    return {} if None in ids else {i: b for b, i in enumerate(ids)}


def _cut(text: str) -> str:
    kept = text.rstrip("\ufffd")
    return text[: max(len(kept), len(text) - _MAX_INCOMPLETE)]


def _continuation(byte: int | None) -> bool:
    return byte is not None and 0x80 <= byte < 0xC0


def _unfinished(ids: list[int], byte_of: dict[int, int]) -> int:
    """How many of ids' last tokens are the bytes of a character they do not finish (0-3)."""
    for n in range(1, min(_MAX_INCOMPLETE, len(ids)) + 1):
        b = byte_of.get(ids[-n])
        if not _continuation(b):
            need = 0 if b is None or b < 0xC0 else 2 if b < 0xE0 else 3 if b < 0xF0 else 4
            return n if need > n else 0
    return 0


def piece(decode, ids: list[int], prefix_length: int, is_final: bool,
          byte_of: dict[int, int] | None = None) -> str:
    """Postprocessing side: the text that `ids[prefix_length:]` add. decode: ids -> str;
    byte_of: fallback_bytes of the tokenizer's vocabulary ({} or None: not byte-fallback)."""
    if byte_of:
        k = 0
        while k < min(prefix_length - 1, _MAX_INCOMPLETE) and _continuation(byte_of.get(ids[k])):
            k += 1
        ids, prefix_length = ids[k:], prefix_length - k

    def text(part: list[int], final: bool) -> str:
        if not byte_of:
            return decode(part) if final else _cut(decode(part))
        # Ended inside a character (max_tokens): its bytes as U+FFFDs, the characters before
        # them as shown, where a byte-fallback decode would make the whole run U+FFFDs.
        unfinished = _unfinished(part, byte_of)
        done = decode(part[:len(part) - unfinished])
        return done + "\ufffd" * unfinished if final else _cut(done)

    before = text(ids[:prefix_length], False) if prefix_length else ""
    return text(ids, is_final)[len(before):]
