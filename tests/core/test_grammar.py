"""A grammar constrains the target's choice at every position it verifies: greedy output under
it is the same with speculation on and off (and equal to the constrained target decoding
alone, in transformers), and sampling keeps the target's constrained distribution (a
chi-square test on a model small enough to enumerate). The loop's tests use a fake of
grammar.Constraint's interface, so that the exact distribution can be written down; the real
engine's (llguidance over the default tokenizer) is tested at the end, and served in
tests/adapters/test_hosted_target.py and tests/e2e/test_openai.py."""
import itertools

import numpy as np
import pytest
import torch
import transformers

from specdec.proposers.ngram import NgramProposer
from specdec.records import Proposer, Request
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines, generate
from tests.core.test_speculative_distribution import (LENGTH, N, PROMPT, V, AcceptanceOnly,
                                                      chi_square_p, tally)


def parity_allows(prev: int, t: int) -> bool:
    """The grammar: each token's parity differs from the token before it."""
    return t % 2 != prev % 2


class Alternating:
    """grammar.Constraint's interface over parity_allows."""

    def __init__(self, last: int, vocab: int):
        self.last, self.vocab = last, vocab
        self.cut = 0   # drafts it cut

    def _mask(self, prev: int) -> np.ndarray:
        words = np.zeros((self.vocab + 31) // 32, np.int64)
        for t in range(self.vocab):
            if parity_allows(prev, t):
                words[t >> 5] |= 1 << (t & 31)
        return words.astype(np.uint32).view(np.int32)

    def masks(self, drafts):
        """grammar.Constraint.masks: the drafts allowed in a row and the first forbidden one."""
        rows, prev = [], self.last
        for j in range(len(drafts) + 1):
            rows.append(self._mask(prev))
            if j == len(drafts):
                return j, np.stack(rows)
            if not parity_allows(prev, drafts[j]):
                self.cut += 1
                return j + 1, np.stack(rows)
            prev = drafts[j]

    def commit(self, tokens):
        for t in tokens:
            assert parity_allows(self.last, t), (self.last, t)
            self.last = t


def constrained_greedy(path, prompt, length, dtype=torch.float64) -> list[int]:
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    ids = list(prompt)
    for _ in range(length):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        allowed = torch.tensor([parity_allows(ids[-1], t) for t in range(len(logits))])
        ids.append(int(logits.masked_fill(~allowed, float("-inf")).argmax()))
    return ids[len(prompt):]


def prompts(n=6):
    gen = torch.Generator().manual_seed(9)
    return [torch.randint(0, 97, (int(l),), generator=gen).tolist()
            for l in torch.randint(2, 20, (n,), generator=gen)]


@pytest.mark.parametrize("k,proposer", [(0, Proposer.DRAFT), (4, Proposer.DRAFT),
                                        (3, Proposer.NGRAM), (4, Proposer.HYBRID)])
def test_greedy_under_a_grammar_is_the_constrained_target_with_and_without_drafts(
        pair_dir, k, proposer):
    target, draft = engines(pair_dir)
    vocab = target.model.args.vocab_size
    ps = prompts()
    grammars = [Alternating(p[-1], vocab) for p in ps]
    results = generate(target, draft, [Request(p, 16, k, proposer=proposer) for p in ps],
                       constraint=lambda i: grammars[i], ngram=NgramProposer())
    for p, (tokens, _, _) in zip(ps, results):
        assert tokens == constrained_greedy(pair_dir[0], p, 16)
    if proposer != Proposer.NGRAM and k:
        # The draft proposes tokens the grammar forbids: those proposals were cut, and drafts
        # it allows were still accepted.
        assert sum(g.cut for g in grammars) > 0
        assert sum(s.total_accepted_draft_tokens for _, s, _ in results) > 0


def exact_constrained(path, params: SamplingParams, prompt, length) -> dict[tuple, float]:
    """P(x1 .. x_length | prompt) under the target masked by the grammar, then the temperature
    and top-k applied (the order the engine applies them: masks, then sampling)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64).eval()
    seqs = list(itertools.product(range(V), repeat=length))
    ids = torch.tensor([list(prompt) + list(seq) for seq in seqs])
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1: -1]
    prob = torch.ones(len(seqs), dtype=torch.float64)
    for pos in range(length):
        prev = ids[:, len(prompt) + pos - 1]
        allowed = (torch.arange(V)[None, :] % 2) != (prev[:, None] % 2)
        scores = logits[:, pos].masked_fill(~allowed, float("-inf")) / params.temperature
        if params.top_k:
            kth = scores.topk(params.top_k, -1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        prob *= torch.softmax(scores, -1).gather(1, ids[:, len(prompt) + pos, None])[:, 0]
    return dict(zip(seqs, prob.tolist()))


@pytest.mark.parametrize("k,params,auto", [
    (3, SamplingParams(temperature=1.0), False),
    (2, SamplingParams(temperature=0.8, top_k=2), False),
    (2, SamplingParams(temperature=1.0), True),
])
def test_sampling_under_a_grammar_keeps_the_constrained_distribution(small_pair, k, params,
                                                                     auto):
    # The target as its own draft: its unmasked q often proposes what the grammar forbids (cut)
    # and, where allowed, is accepted often (p masked and renormalized is at least q there).
    target, draft = engines((small_pair[0], small_pair[0]), max_sequences=N, max_len=16)
    reqs = [Request(PROMPT, LENGTH, k, SamplingParams(params.temperature, params.top_k,
                                                      params.top_p, seed=1_000_003 * i + 7),
                    auto=auto, prefill_alone=False) for i in range(N)]
    grammars = [Alternating(PROMPT[-1], V) for _ in reqs]
    results = generate(target, draft, reqs, planner=AcceptanceOnly(k) if auto else None,
                       constraint=lambda i: grammars[i])
    counts = tally(results)
    accepted = sum(s.total_accepted_draft_tokens for _, s, _ in results)
    assert accepted > N // 4 and sum(g.cut for g in grammars) > N // 4   # both paths weigh
    assert chi_square_p(counts, exact_constrained(small_pair[0], params, PROMPT, LENGTH)) > 1e-3
    # The negative control: the unconstrained target's distribution is rejected.
    from tests.core.test_speculative_distribution import exact_distribution
    assert chi_square_p(counts, exact_distribution(small_pair[0], params)) < 1e-6


def test_the_json_engine_cuts_at_a_forbidden_draft_and_rolls_back():
    import json

    from specdec.serving.grammar import CACHED, Grammars, GrammarError, allowed
    from specdec.serving.tokenizer import load_tokenizer
    from tests.e2e.conftest import ROOT
    target = ROOT / "models" / "default" / "target"
    tok = load_tokenizer(str(target))
    grammars = Grammars(tok, len(tok), (tok.eos_token_id,))
    schema = json.dumps({"type": "object", "properties": {"ok": {"type": "boolean"}},
                         "required": ["ok"], "additionalProperties": False})
    ids = tok('{"ok": true}', add_special_tokens=False)["input_ids"]
    c = grammars.constraint(schema)
    n, masks = c.masks(ids)
    assert n == len(ids) and masks.shape == (len(ids) + 1, (len(tok) + 31) // 32)
    assert all(allowed(masks[j], t) for j, t in enumerate(ids))
    assert allowed(masks[-1], tok.eos_token_id)            # the object is complete
    bad = tok("x", add_special_tokens=False)["input_ids"]
    n, masks = c.masks(ids[:2] + bad + ids[2:])            # a forbidden draft in third place
    assert n == 3 and len(masks) == 3 and not allowed(masks[2], bad[0])   # kept, the last
    c.commit(ids[:2])                                      # rolled back: the walk left no trace
    n, _ = c.masks(ids[2:])
    assert n == len(ids) - 2
    # An end of sequence ends the walk (nothing after it is scored), and the rollback stays
    # exact across it: llguidance's does not count a consumed end of sequence.
    n, masks = c.masks(ids[2:] + [tok.eos_token_id] + ids[:1])
    assert n == len(ids) - 1 and len(masks) == len(ids) - 1
    c.commit(ids[2:] + [tok.eos_token_id])
    assert not c.matcher.is_error() and c.matcher.is_stopped()
    # Each request's matcher is its own; a schema compiles once; a bad one is the request's.
    other = grammars.constraint(schema)
    assert other.masks(ids)[0] == len(ids) and len(grammars.compiled) == 1
    for broken in ("{not json", json.dumps({"type": "no such type"})):
        with pytest.raises(GrammarError):
            grammars.constraint(broken)
    for i in range(CACHED + 1):
        grammars.constraint(json.dumps({"type": "object", "title": f"t{i}"}))
    assert len(grammars.compiled) == CACHED and schema not in grammars.compiled
