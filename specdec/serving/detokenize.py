"""Streaming-safe detokenization between a stateless postprocessing step and the orchestrator.

Each streamed response carries the last few shown ids plus the new ones (`window`), and how many
of them were shown before. The text of a token list is its decode with up to three trailing
U+FFFD cut (an incomplete UTF-8 character: one U+FFFD from a byte-level BPE decode, one per byte
from a byte-fallback decode, never more than three), except on the final response. Because
shown text is always such a cut prefix, each piece is the new text's difference from the old:
multi-byte characters split across tokens come out whole, once.
"""
from __future__ import annotations

WINDOW = 8  # ids of context before the new ones: more than the at most 3 ids ever held back
MAX_WINDOW = 64  # shown ids sent at most, however many of them decode to nothing
_MAX_INCOMPLETE = 3  # bytes of a 4-byte UTF-8 character that can arrive before its last


def window(shown: list[int], new: list[int],
           skipped: frozenset[int] = frozenset()) -> tuple[list[int], int]:
    """Orchestrator side: (ids to send, how many of them were shown before).

    skipped: ids the decode leaves out (special tokens, tokenizer.special_ids). The shown ids
    reach back to WINDOW of the others (at most MAX_WINDOW ids): a window of the tail of a
    character shown before and skipped ids alone decodes to U+FFFDs that the cut of a held-back
    character takes for one, and the tail came out again as U+FFFD."""
    start = max(0, len(shown) - WINDOW)
    if skipped and not skipped.isdisjoint(shown[start:]):
        start, kept = len(shown), 0
        while start > 0 and kept < WINDOW and len(shown) - start < MAX_WINDOW:
            start -= 1
            kept += shown[start] not in skipped
    return shown[start:] + new, len(shown) - start


def _cut(text: str) -> str:
    kept = text.rstrip("\ufffd")
    return text[: max(len(kept), len(text) - _MAX_INCOMPLETE)]


def piece(decode, ids: list[int], prefix_length: int, is_final: bool) -> str:
    """Postprocessing side: the text that `ids[prefix_length:]` add. decode: ids -> str."""
    full = decode(ids)
    full = full if is_final else _cut(full)
    before = _cut(decode(ids[:prefix_length])) if prefix_length else ""
    return full[len(before):]
