"""Prompt-lookup proposals: the sequence's own text as the draft, no draft model.

Saxena 2023, "Prompt Lookup Decoding"; Yang et al. 2023, "Inference with Reference: Lossless
Acceleration of Large Language Models" (LLMA). Code edits, refactors, summaries and extraction
repeat spans of their input: when the last n committed tokens occurred before, the tokens that
followed them then are a cheap guess of what follows now. The guess is deterministic, so the
target verifies it as a one-hot q (verify.py) and the output stays exactly the target's.

Matching: the longest n in max_n..min_n whose last n tokens occurred earlier in the prompt or the
output; of its occurrences the most recent wins (nearest text, likeliest to be what is being
copied). The proposal is what followed it, up to k tokens, none without a match (the round is
then the target's alone). When what followed reaches the end of the history within k tokens
(the match is p < k tokens back: the text loops with period p), the proposal repeats those p
tokens, as the loop would: once they are in the history it ends with the same n-gram again, p
tokens after its previous occurrence, which a lookup then would follow. Without it a loop of
period 2 proposed 2 tokens a round however long it ran.

Each sequence's history is a list of tokens and an index from every n-gram (n in min_n..max_n)
to the positions where it ends, appended to and rolled back incrementally: a lookup costs a few
dict reads, and each appended token is indexed once and unindexed at most once, never a scan
of the history (about 1.5 us of CPU per token indexed and 25 us per round on the 2-core
development machine). It runs in the orchestrator's process, which holds the committed tokens.

Like the draft model, it is told `start` (the length to roll back to) and the committed tokens
from there on. It also appends its own proposal to the history, as the draft model feeds its
drafts to its cache: the loop's next `start` may count accepted proposed tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..records import Proposal, ProposeCall

# Up to four tokens to pick the right occurrence among several, at least two: a single token (a
# newline, a comma) recurs everywhere. On the default pair's held-out prompts at K=4, going down
# to one token proposes twice the tokens (1.71 a round, not 0.86) for 10 % more tokens per round
# (1.68, not 1.53), acceptance falling from 0.61 to 0.40 (benchmarks/proposers.py --min-n 1).
MAX_N = 4
MIN_N = 2


@dataclass(frozen=True)
class Match:
    n: int           # tokens matched at the end of the history (0: no match)
    at: int          # position of the first token that followed the match
    period: int      # tokens from `at` to the end of the history (>= 1 when n > 0)

    def proposes(self, k: int) -> int:
        """Tokens a proposal of at most k would hold: k with a match (a short continuation
        repeats), none without."""
        return k if self.n else 0

    def tokens(self, history: list[int], k: int) -> list[int]:
        """The proposal of at most k tokens from `history` (the one matched)."""
        return [history[self.at + i % self.period] for i in range(self.proposes(k))]


NO_MATCH = Match(0, 0, 0)


class _History:
    def __init__(self, min_n: int, max_n: int):
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> end positions, ascending

    def append(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self.ends.setdefault(tuple(self.tokens[end - n:end]), []).append(end)

    def truncate(self, length: int) -> None:
        # The removed positions are the latest: each is the last entry of its n-grams' lists.
        for end in range(len(self.tokens), length, -1):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                key = tuple(self.tokens[end - n:end])
                ends = self.ends[key]
                ends.pop()
                if not ends:
                    del self.ends[key]
        del self.tokens[length:]

    def match(self) -> Match:
        end = len(self.tokens)
        for n in range(min(self.max_n, end - 1), self.min_n - 1, -1):
            ends = self.ends[tuple(self.tokens[end - n:])]
            if len(ends) > 1:                  # ends[-1] is the suffix itself
                return Match(n, ends[-2], end - ends[-2])
        return NO_MATCH


class NgramProposer:
    """A `Drafter` (loop.py) proposing continuations looked up in each sequence's own text."""

    def __init__(self, max_n: int = MAX_N, min_n: int = MIN_N):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n} "
                             f"max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.seqs: dict[int, _History] = {}

    def lookup(self, seq_id: int, start: int, tokens: list[int]) -> Match:
        """Bring the sequence up to date (roll back to `start`, append the committed `tokens`)
        and return its current match, without proposing: what a per-round choice between
        proposers needs. The proposer then holds start + len(tokens) tokens."""
        h = self.seqs.get(seq_id)
        if h is None:
            h = self.seqs[seq_id] = _History(self.min_n, self.max_n)
        if start > len(h.tokens):
            raise ValueError(f"sequence {seq_id}: start {start} beyond the {len(h.tokens)} "
                             f"tokens held")
        h.truncate(start)
        h.append(tokens)
        return h.match()

    async def propose(self, call: ProposeCall) -> Proposal:
        m = self.lookup(call.seq_id, call.start, call.tokens)
        h = self.seqs[call.seq_id]
        drafts = m.tokens(h.tokens, call.k)
        h.append(drafts)
        return Proposal(drafts, None)

    async def release(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)
