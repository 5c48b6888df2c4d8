"""Suffix decoding: proposals from suffix trees over the request's own text and over earlier
requests' outputs, as long as the trees' frequencies make them likely, no draft model.

Oliaro et al. 2024, "SuffixDecoding" (Snowflake's Arctic Inference). Agents send the same tool
calls, JSON and code again and again across requests; prompt lookup (ngram.py) sees only the
request's own text and proposes a fixed length. Here every window of up to DEPTH tokens of a
text is a path in a trie whose nodes count how often it occurred. The longest suffix of the
committed text (up to MAX_MATCH tokens) found in a tree leads to a node; the proposal follows
its most frequent child while the product of the steps' frequencies (count of the child over
all its siblings') stays at MIN_PROBABILITY or above, and at most MATCH_FACTOR times the match's
length: a confident, long match proposes many tokens, a weak one few or none. The request's own
tree and the server's (earlier requests' outputs) each propose; the one whose proposal expects
more accepted tokens (the sum of its running probabilities) wins.

A proposal is deterministic: the target verifies it as a one-hot q (verify.py), so the output
is exactly the target's. The trees hold committed tokens only, so nothing rolls back. A
request's tree grows as its tokens commit, a few dictionary steps a token; its output joins the
server's tree when it ends, on a thread of its own. The server's tree keeps at most
`max_tokens` tokens of outputs (the oldest go first), one tree for all requests or one per
tenant (`tenants`: a request's tenant input keeps its outputs among its own).
"""
from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor

DEPTH = 16            # tokens a path holds: the match and the proposal after it
MAX_MATCH = 8         # the longest suffix of the committed text looked up
MIN_PROBABILITY = 0.1
MATCH_FACTOR = 2.0    # a proposal is at most this many times its match's length


class _Node:
    __slots__ = ("count", "children")

    def __init__(self):
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTree:
    """Every window of up to DEPTH tokens of the texts added, as a trie with counts."""

    def __init__(self):
        self.root = _Node()
        self.nodes = 0

    def _walk(self, tokens: list[int], step: int, open_paths: deque[_Node]) -> None:
        """Add (step 1) or remove (step -1) every window of tokens: each token extends by one
        node the paths of the windows that end before it (open_paths, DEPTH at most)."""
        for t in tokens:
            if len(open_paths) == DEPTH:
                open_paths.popleft()
            open_paths.append(self.root)
            for i, node in enumerate(open_paths):
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                    self.nodes += 1
                child.count += step
                if child.count == 0:
                    del node.children[t]
                    self.nodes -= 1
                open_paths[i] = child

    def add(self, tokens: list[int], open_paths: deque[_Node] | None = None) -> None:
        """open_paths: those of the text these tokens continue (kept by the caller)."""
        self._walk(tokens, 1, deque() if open_paths is None else open_paths)

    def remove(self, tokens: list[int]) -> None:
        self._walk(tokens, -1, deque())

    def propose(self, context: list[int], k: int) -> tuple[list[int], float]:
        """(the proposal after the longest suffix of context found, at most k tokens; its
        expected accepted tokens)."""
        for m in range(min(MAX_MATCH, len(context)), 0, -1):
            node = self.root
            for t in context[len(context) - m:]:
                node = node.children.get(t)
                if node is None:
                    break
            if node is not None and node.children:
                return _follow(node, min(k, int(MATCH_FACTOR * m)))
        return [], 0.0


def _follow(node: _Node, k: int) -> tuple[list[int], float]:
    tokens, p, expected = [], 1.0, 0.0
    while len(tokens) < k and node.children:
        t, child = max(node.children.items(), key=lambda kv: kv[1].count)
        p *= child.count / sum(c.count for c in node.children.values())
        if p < MIN_PROBABILITY:
            break
        tokens.append(t)
        expected += p
        node = child
    return tokens, expected


class _Sequence:
    def __init__(self, prompt: list[int], tenant: str):
        self.tree = SuffixTree()
        self.tokens = list(prompt)
        self.prompt_len, self.tenant = len(prompt), tenant
        self.open_paths: deque[_Node] = deque()   # its text's, between calls
        self.tree.add(self.tokens, self.open_paths)


class SuffixProposer:
    """A server's suffix trees: each sequence's own, and the outputs of finished ones."""

    def __init__(self, max_tokens: int = 20000, tenants: bool = False):
        self.max_tokens, self.tenants = max_tokens, tenants
        self.seqs: dict[int, _Sequence] = {}
        self.shared: dict[str, SuffixTree] = {}
        self.documents: deque[tuple[str, list[int]]] = deque()   # oldest first
        self.held = 0                                            # their tokens
        self.lock = threading.Lock()
        self.builder = ThreadPoolExecutor(1, thread_name_prefix="suffix")

    def open(self, seq_id: int, prompt: list[int], tenant: str = "") -> None:
        self.seqs[seq_id] = _Sequence(prompt, tenant if self.tenants else "")

    def commit(self, seq_id: int, tokens: list[int]) -> None:
        """A round's committed tokens join the sequence's tree."""
        s = self.seqs[seq_id]
        s.tokens.extend(tokens)
        s.tree.add(tokens, s.open_paths)

    def lookup(self, seq_id: int, k: int, own_only: bool = False) -> list[int]:
        """What the sequence's text proposes now (at most k tokens): its own tree's or the
        server's, whichever expects more accepted tokens."""
        s = self.seqs[seq_id]
        own = s.tree.propose(s.tokens, k)
        if own_only:
            return own[0]
        with self.lock:
            tree = self.shared.get(s.tenant)
            shared = tree.propose(s.tokens, k) if tree is not None else ([], 0.0)
        return max(own, shared, key=lambda x: x[1])[0]

    def finish(self, seq_id: int) -> None:
        """The sequence's output joins the server's tree, off the caller's thread."""
        s = self.seqs.pop(seq_id, None)
        if s is not None and len(s.tokens) > s.prompt_len:
            self.builder.submit(self._keep, s.tenant, s.tokens[s.prompt_len:])

    def _keep(self, tenant: str, output: list[int]) -> None:
        with self.lock:
            self.shared.setdefault(tenant, SuffixTree()).add(output)
            self.documents.append((tenant, output))
            self.held += len(output)
            while self.held > self.max_tokens and self.documents:
                old_tenant, old = self.documents.popleft()
                self.shared[old_tenant].remove(old)
                self.held -= len(old)

    def settle(self) -> None:
        """Wait for the outputs being added (tests, benchmarks)."""
        self.builder.submit(lambda: None).result()

    @property
    def nodes(self) -> int:
        with self.lock:
            return sum(t.nodes for t in self.shared.values())

