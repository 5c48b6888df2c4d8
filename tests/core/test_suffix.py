"""Suffix decoding (specdec/proposers/suffix.py): the trees count every window of a text, propose
what followed a match as far as its frequencies allow, forget the oldest outputs past the bound and
never share across tenants; served by the loop its output is exactly the target's, greedy and
sampled (a chi-square test), whatever the trees held."""
import pytest

from specdec.proposers.ngram import NgramProposer
from specdec.records import Proposer, Request
from specdec.runtime.sampling import SamplingParams
from specdec.proposers.suffix import DEPTH, MIN_PROBABILITY, SuffixProposer, SuffixTree
from tests.core.conftest import engines, generate
from tests.core.test_speculative_distribution import LENGTH, N, assert_follows, tally
from tests.core.test_speculative_exact import prompts


def nodes_by_walk(tree: SuffixTree) -> int:
    todo, n = [tree.root], 0
    while todo:
        node = todo.pop()
        n += len(node.children)
        todo.extend(node.children.values())
    return n


def test_a_tree_counts_every_window_and_forgets_a_text_it_removes():
    tree = SuffixTree()
    text = [1, 2, 3, 1, 2, 4, 1, 2, 3]
    tree.add(text)
    # The window [1, 2] occurred three times, followed by 3 twice and by 4 once.
    node = tree.root.children[1].children[2]
    assert node.count == 3 and {t: c.count for t, c in node.children.items()} == {3: 2, 4: 1}
    assert tree.nodes == nodes_by_walk(tree) > 0
    assert all(len(path) <= DEPTH for path in [text])
    tree.remove(text)
    assert tree.nodes == 0 and not tree.root.children


def test_a_proposal_follows_the_likeliest_continuation_while_it_is_likely():
    tree = SuffixTree()
    tree.add([7, 8, 9, 10, 11] * 3 + [7, 8, 5])
    tokens, expected = tree.propose([0, 7, 8], 8)
    # After [7, 8]: 9 three times of four, then [10, 11, 7, 8] as the text went.
    assert tokens[:3] == [9, 10, 11] and expected > 0
    assert len(tokens) <= 2 * 2                 # at most MATCH_FACTOR times the match
    lone = SuffixTree()
    spread = int(1 / MIN_PROBABILITY) + 2        # continuations of [1, 2], each as likely
    lone.add([t for i in range(spread) for t in (1, 2, 100 + i)])
    assert lone.propose([1, 2], 8)[0] == []     # none likely enough
    assert tree.propose([42], 8) == ([], 0.0)


def test_earlier_outputs_propose_across_requests_within_a_tenant_and_the_bound():
    s = SuffixProposer(max_tokens=40, tenants=True)
    call = [5, 6, 7, 8, 9, 10, 11, 12]
    s.open(1, [1, 2, 3], tenant="a")
    s.commit(1, call)
    s.finish(1)
    s.settle()
    s.open(2, [4, 5, 6], tenant="a")
    s.open(3, [4, 5, 6], tenant="b")
    assert s.lookup(2, 4)[:4] == [7, 8, 9, 10]        # tenant a's earlier output
    assert s.lookup(3, 4) == []                        # never across tenants
    assert s.lookup(2, 4, own_only=True) == []         # a seeded sampling request's
    before = s.nodes
    for i in range(10):                                # outputs past the bound push it out
        s.open(10 + i, [0], tenant="a")
        s.commit(10 + i, [100 + i] * 5)
        s.finish(10 + i)
    s.settle()
    assert s.held <= 40 and s.lookup(2, 4) == [] and s.nodes < before + 10 * 5 * DEPTH
    s.finish(2)
    s.finish(3)


@pytest.mark.parametrize("proposer,k,auto", [(Proposer.SUFFIX, 4, False),
                                             (Proposer.SUFFIX, 8, False),
                                             (Proposer.HYBRID, 8, True)])
def test_greedy_with_suffix_decoding_is_the_target_alone(pair_dir, proposer, k, auto):
    """The second pass finds the first's outputs in the server's tree and drafts from them;
    hybrid under auto takes them where they promise more than the draft model."""
    from tests.core.test_speculative_distribution import AcceptanceOnly
    target, draft = engines(pair_dir)
    ps = prompts(8)
    alone = [r[0] for r in generate(target, draft, [Request(p, 24, 0) for p in ps])]
    suffix, planner, rounds = SuffixProposer(), AcceptanceOnly(k) if auto else None, []
    for run in range(2):
        rounds.clear()
        results = generate(target, draft, [Request(p, 24, k, proposer=proposer, auto=auto)
                                           for p in ps], suffix=suffix, ngram=NgramProposer(),
                           planner=planner, on_round=rounds.append)
        suffix.settle()
        assert [r[0] for r in results] == alone
    by_suffix = [r for r in rounds if r.proposer == Proposer.SUFFIX and r.k]
    accepted = sum(r.accepted for r in by_suffix)
    assert accepted > len(ps) * 4 and accepted / sum(r.k for r in by_suffix) > 0.5
    assert not suffix.seqs and suffix.held == 2 * sum(len(a) for a in alone)


def test_sampling_with_suffix_proposals_follows_the_target(small_pair):
    """Deterministic proposals from earlier outputs (one-hot q): accepted with p(d), corrected
    from p without d; the draws still follow the target exactly."""
    prompt, params = [0, 3, 4, 0, 3], SamplingParams(temperature=1.0)
    target, draft = engines(small_pair, max_sequences=N, max_len=16)
    suffix = SuffixProposer(max_tokens=10 ** 6)
    seed_outputs = generate(target, draft, [Request(prompt, LENGTH, 0, SamplingParams(
        1.0, seed=3 * i + 1)) for i in range(200)])
    for i, (tokens, _, _) in enumerate(seed_outputs):   # the server saw these answers
        suffix.open(-1 - i, prompt)
        suffix.commit(-1 - i, tokens)
        suffix.finish(-1 - i)
    suffix.settle()
    reqs = [Request(prompt, LENGTH, 3, SamplingParams(1.0, seed=1_000_003 * i + 7),
                    prefill_alone=False, proposer="suffix") for i in range(N)]
    results = generate(target, draft, reqs, suffix=suffix)
    proposed = sum(s.total_draft_tokens for _, s, _ in results)
    rate = sum(s.total_accepted_draft_tokens for _, s, _ in results) / proposed
    assert proposed > N and 0.15 < rate < 0.95, (proposed, rate)
    assert_follows(tally(results), small_pair[0], small_pair[1], params, prompt)


def test_hybrid_with_suffix_decoding_samples_follow_the_target(small_pair):
    """Per round the policy picks suffix decoding's one-hot proposals or the sampling draft's
    (its q), by what earlier rounds accepted: the output is still exactly the target's."""
    from tests.core.test_speculative_distribution import AcceptanceOnly
    prompt, params = [0, 3, 4, 0, 3], SamplingParams(temperature=1.0)
    target, draft = engines(small_pair, max_sequences=N, max_len=16)
    suffix = SuffixProposer(max_tokens=10 ** 6)
    for i, (tokens, _, _) in enumerate(generate(target, draft, [Request(
            prompt, LENGTH, 0, SamplingParams(1.0, seed=3 * i + 1)) for i in range(200)])):
        suffix.open(-1 - i, prompt)
        suffix.commit(-1 - i, tokens)
        suffix.finish(-1 - i)
    suffix.settle()
    reqs = [Request(prompt, LENGTH, 2, SamplingParams(1.0, seed=1_000_003 * i + 7), auto=True,
                    prefill_alone=False, proposer="hybrid") for i in range(N)]
    rounds = []
    results = generate(target, draft, reqs, planner=AcceptanceOnly(2), on_round=rounds.append,
                       suffix=suffix)
    by = {p: sum(r.k for r in rounds if r.proposer == p) for p in ("draft", "suffix")}
    assert min(by.values()) > N // 10, by          # both proposers carry weight
    assert_follows(tally(results), small_pair[0], small_pair[1], params, prompt)
