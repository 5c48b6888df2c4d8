"""Structured outputs: a grammar (a JSON schema) constrains the target's choice at every
position the target scores, so that constrained output is exact under speculation.

Before a verification the sequence's matcher walks the round's drafts, computing the token mask
after the committed text and after each draft in turn; the first draft the grammar forbids ends
the proposal there (loop.speculate keeps it, the last: dropping it would skew sampling, since
the token drawn in its place must come from the residual max(0, p - q), as after any
rejection). The verification masks the target's logits at every position it scores
(sampling.apply_token_masks), so a forbidden draft has probability 0 and is rejected, and the
accepted run and the token after it are the constrained target's: greedy output is the same
with speculation on and off, and sampling keeps the target's constrained distribution. The
matcher then rolls back the drafts it walked and takes the verdict's tokens.

The engine is llguidance, chosen by its measured mask time at a 128k vocabulary
(benchmarks/grammar_masks.py, docs/benchmarks.md). A mask is int32 [ceil(V / 32)]: token t is
allowed where bit t % 32 of word t // 32 is set, the layout both llguidance and xgrammar use.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

CACHED = 64   # compiled schemas a server keeps, the least recently used dropped first
# JSON in json.dumps' layout: no whitespace but the separators' (a schema's "x-guidance" may
# say otherwise). With any whitespace allowed, a model can pad an answer to its max_tokens.
LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A schema the engine refuses: that request's error."""


def allowed(mask: np.ndarray, token: int) -> bool:
    return bool((int(mask[token >> 5]) >> (token & 31)) & 1)


class Grammars:
    """A server's grammar engine: the tokenizer's vocabulary read once, schemas compiled and
    cached by their text as a matcher each request's is copied from (the copies share what
    the engine learns of the vocabulary: a copy's masks took 4 us a token where a new
    matcher's took 7-50)."""

    def __init__(self, tokenizer, vocab_size: int, eos: tuple[int, ...]):
        import llguidance.hf
        self.vocab_size, self.eos = vocab_size, frozenset(eos)
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size,
                                                      eos_token=list(eos) or None)
        self.compiled: OrderedDict[str, object] = OrderedDict()   # schema -> LLMatcher

    @classmethod
    def load(cls, tokenizer_dir: str, vocab_size: int, eos: tuple[int, ...]) -> "Grammars":
        from .tokenizer import load_tokenizer
        return cls(load_tokenizer(tokenizer_dir), vocab_size, eos)

    def _matcher(self, schema: str):
        from llguidance import LLMatcher
        matcher = self.compiled.pop(schema, None)
        if matcher is None:
            try:
                grammar = LLMatcher.grammar_from_json_schema(schema, defaults=LAYOUT)
            except Exception as e:   # not JSON, or not a schema it takes
                raise GrammarError(str(e).strip() or type(e).__name__) from None
            failed, messages = LLMatcher.validate_grammar_with_warnings(grammar, self.tokenizer)
            if failed:
                raise GrammarError("; ".join(messages))
            matcher = LLMatcher(self.tokenizer, grammar)
        self.compiled[schema] = matcher
        while len(self.compiled) > CACHED:
            self.compiled.popitem(last=False)
        return matcher

    def constraint(self, schema: str) -> "Constraint":
        return Constraint(self._matcher(schema).deep_copy(), self.vocab_size, self.eos)


class Constraint:
    """One sequence's matcher, at its committed tokens between rounds (loop.speculate)."""

    def __init__(self, matcher, vocab_size: int, eos: frozenset[int] = frozenset()):
        self.matcher, self.words, self.eos = matcher, (vocab_size + 31) // 32, eos

    def _fill(self, rows: np.ndarray, j: int) -> None:
        row = rows[j]
        self.matcher.unsafe_compute_mask_ptr(row.ctypes.data, row.nbytes)
        if self.matcher.is_error():   # its mask means nothing then: the request fails
            raise RuntimeError(f"the grammar could not compute a mask: "
                               f"{self.matcher.get_error()[:2000]}")

    def masks(self, drafts: list[int]) -> tuple[int, np.ndarray]:
        """(how many drafts to verify, the masks [n, W] of the positions their verification
        scores up to the first it forbids). Those the grammar allows in a row, and the first it
        forbids after them, the last (see the module's docstring); or up to an end of sequence,
        after which nothing is scored."""
        rows = np.zeros((len(drafts) + 1, self.words), np.int32)
        consumed = 0
        for j in range(len(drafts) + 1):
            self._fill(rows, j)
            if j == len(drafts):
                keep = j
                break
            if not allowed(rows[j], drafts[j]):
                keep = j + 1
                break
            if drafts[j] in self.eos:   # generation ends there; and the engine's rollback
                keep = j + 1            # does not count a consumed end of sequence
                break
            self.matcher.consume_token(drafts[j])
            consumed += 1
        if consumed:
            self.matcher.rollback(consumed)
        return keep, rows[:j + 1]

    def commit(self, tokens: list[int]) -> None:
        """The verdict's tokens, each allowed by the masks it was chosen under."""
        for t in tokens:
            if t in self.eos or self.matcher.is_stopped():
                return
            self.matcher.consume_token(t)
        if self.matcher.is_error():
            raise RuntimeError(f"the grammar refused a verified token: {self.matcher.get_error()}")
