"""Speculation with an EAGLE-3 head in the target's engine: the verification of round r drafts
round r + 1. Temperature 0: output equals the target's own greedy output; sampling: the output
follows the target's distribution, the head's q verified where it was made; a failing head costs
only its proposals."""
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specdec.proposers.eagle.checkpoint import HeadCheckpoint, load_head
from specdec.proposers.eagle.config import HeadArgs
from specdec.proposers.eagle.head import EagleHead
from specdec.runtime.engine import Engine
from specdec.proposers.eagle import drafting
from specdec.proposers.eagle.drafting import HeadDrafter
from specdec.runtime.graphs import GraphedForward
from specdec.proposers.ngram import NgramProposer
from specdec.planning.estimates import PriorCosts
from specdec.planning.planner import Planner
from specdec.records import Request, VerifyCall
from specdec.runtime.sampling import SamplingParams
from specdec.runtime.weights import load_model
from specdec.hooks.faults import fail_drafters
from tests.core.conftest import generate
from tests.core.eagle_helpers import trained_head_dir
from tests.core.test_fast_paths import reference_flash_with_kvcache
from tests.core.test_speculative_exact import MAX_TOKENS, prompts, transformers_greedy
from tests.core.test_speculative_distribution import (AcceptanceOnly, N, PROMPT, assert_follows,
                                                      chi_square_p, exact_distribution, tally)

CPU = torch.device("cpu")
# Four tokens (625 continuations): the first comes from the prefill, which makes the head's
# first proposal, so three are left to draft.
LENGTH = 4


def random_head(model, aux=(0, 1, 1), seed=0, sharpen=4.0) -> EagleHead:
    """An untrained head over the whole vocabulary, its logits sharpened so that q is far from
    uniform: it agrees with the target some of the time, by chance."""
    a = model.args
    layer = replace(a, num_layers=1, tie_word_embeddings=False, layer_windows=(),
                    eos_token_ids=())
    torch.manual_seed(seed)
    head = EagleHead(HeadArgs(layer, a.vocab_size, a.hidden_size, aux)).to(
        model.lm_head.weight.dtype)
    with torch.no_grad():
        head.lm_head.weight.mul_(sharpen)
    return head.eval().requires_grad_(False)


def eagle_engine(target_dir, head=None, max_sequences=32, max_len=128, dtype=torch.float64):
    model = load_model(target_dir, dtype, CPU)
    return Engine(model, max_sequences, max_len, CPU, head=HeadDrafter(head or random_head(model)))


@pytest.mark.parametrize("k,params,auto", [
    (3, SamplingParams(temperature=1.0), False),
    (2, SamplingParams(temperature=0.8, top_k=4, top_p=0.9), False),
    (3, SamplingParams(temperature=1.0), True),
])
def test_eagle_samples_follow_target(small_pair, k, params, auto):
    engine = eagle_engine(small_pair[0], max_sequences=N, max_len=16)
    reqs = [Request(PROMPT, LENGTH, k, SamplingParams(params.temperature, params.top_k,
                                                      params.top_p, seed=1_000_003 * i + 7),
                    auto=auto, prefill_alone=False, proposer="eagle") for i in range(N)]
    rounds = []
    results = generate(engine, None, reqs, planner=AcceptanceOnly(k) if auto else None,
                       on_round=rounds.append)
    counts = tally(results)
    proposed = sum(s.total_draft_tokens for _, s, _ in results)
    rate = sum(s.total_accepted_draft_tokens for _, s, _ in results) / proposed
    assert proposed > 1.5 * N and 0.2 < rate < 0.95, (proposed, rate)  # both paths weigh
    assert all(r.proposer == "eagle" for r in rounds if r.k)
    if auto:   # k varied by round (the policy within each round's limit)
        chosen = [r.k for r in rounds if r.limit]
        assert all(chosen.count(j) > N // 20 for j in (1, 2)), chosen
    assert_follows(counts, small_pair[0], small_pair[1], params, length=LENGTH)
    assert engine.pool.active == 0 and not engine.q   # every sequence's state released


def test_hybrid_of_lookup_and_head_samples_follow_target(small_pair):
    prompt, params = [0, 3, 4, 0, 3], SamplingParams(temperature=1.0)
    engine = eagle_engine(small_pair[0], max_sequences=N, max_len=16)
    reqs = [Request(prompt, LENGTH, 2, SamplingParams(1.0, seed=1_000_003 * i + 7), auto=True,
                    prefill_alone=False, proposer="hybrid") for i in range(N)]
    planner, rounds = AcceptanceOnly(2), []
    planner.acceptance["ngram"].add(2, 1)
    results = generate(engine, None, reqs, planner=planner, on_round=rounds.append,
                       ngram=NgramProposer())
    by = {p: sum(r.k for r in rounds if r.proposer == p) for p in ("eagle", "ngram")}
    assert min(by.values()) > N // 10, by
    counts = tally(results)
    assert chi_square_p(counts, exact_distribution(small_pair[0], params, prompt, LENGTH)) > 1e-3


def test_sampled_proposal_whose_q_is_gone_is_not_verified(small_pair):
    """After a restart the head's q is gone: its sampled drafts are dropped, never verified as
    one-hot (which would not be exact)."""
    engine = eagle_engine(small_pair[0], max_len=16)
    s = SamplingParams(temperature=1.0, seed=5)
    v = engine.verify([VerifyCall(1, 0, PROMPT, [], None, s, next_k=3, next_by="eagle")])[0]
    assert len(v.proposal) == 3 and engine.q[1].shape[0] == 3
    engine.q.clear()
    again = engine.verify([VerifyCall(1, len(PROMPT), v.tokens, v.proposal, None, s, next_k=2,
                                      next_by="eagle",
                                      drafts_in_target=True)])[0]
    assert again.num_accepted == 0 and len(again.tokens) == 1 and len(again.proposal) == 2


def test_the_head_catches_up_on_committed_positions_only(small_pair):
    """A verification of k drafts of which m are accepted caches the head's pairs for the
    committed token and the m accepted drafts, not for the rejected ones (on a compute-bound
    device they cost as much), and its proposal equals the one it makes after a verification
    that carried only the accepted drafts."""
    engine = eagle_engine(small_pair[0], max_len=32)
    widths = []
    forward = engine.head._forward
    engine.head._forward = lambda batch, feature: widths.append(batch.tokens.shape[1]) or \
        forward(batch, feature)
    greedy = SamplingParams()
    first = engine.verify([VerifyCall(1, 0, PROMPT, [], None, greedy, next_k=3,
                                      next_by="eagle")])[0]
    n = len(PROMPT)
    target = engine.verify([VerifyCall(2, 0, PROMPT + first.tokens, [], None, greedy)])[0]
    drafts = target.tokens + [(target.tokens[0] + 1) % 5] * 3     # one right, three wrong
    widths.clear()
    v = engine.verify([VerifyCall(1, n, first.tokens, drafts, None, greedy, next_k=3,
                                  next_by="eagle")])[0]
    assert v.num_accepted == 1 and widths[0] == 2          # 1 committed + 1 accepted, not 5
    engine.verify([VerifyCall(3, 0, PROMPT, [], None, greedy, next_k=3, next_by="eagle")])
    alone = engine.verify([VerifyCall(3, n, first.tokens, drafts[:1], None, greedy,
                                      next_k=3, next_by="eagle")])[0]
    assert alone.tokens == v.tokens and alone.proposal == v.proposal


def test_a_request_that_drafts_nothing_costs_the_head_nothing(small_pair):
    """Target-only (num_draft_tokens 0) beside a head: no catch-up forward of the head a round
    (9 % of the serving process's CPU at 16 streams, simulated.py), the target's own tokens."""
    engine = eagle_engine(small_pair[0], max_len=32)
    forwards = []
    forward = engine.head._forward
    engine.head._forward = lambda batch, feature: forwards.append(1) or forward(batch, feature)
    plain = generate(engine, None, [Request(PROMPT, 8, 0, proposer="eagle")])[0][0]
    assert forwards == [] and len(plain) == 8
    assert generate(engine, None, [Request(PROMPT, 8, 3, proposer="eagle")])[0][0] == plain
    assert forwards   # the same head drafts for a request that asks


@pytest.mark.parametrize("params", [SamplingParams(),
                                    SamplingParams(temperature=0.8, top_p=0.95, seed=11)],
                         ids=["greedy", "sampled"])
def test_an_off_heads_pairs_wait_for_its_next_draft_and_draft_the_same(pair_dir, greedy, params,
                                                                        monkeypatch):
    """A row the policy drafts nothing for leaves its pairs waiting (drafting.DEFER_MAX) and the
    head writes them with its next drafting round's, or at DEFER_MAX: every round drafts what
    it drafts when the head writes them each verification, and greedy output is the target's.
    An untrained head whose token costs half a verification is off most rounds under auto, and
    probed now and then."""
    DEAR = PriorCosts(eagle_token=0.004)   # a head token half a verification: off when wrong
    steps = drafting.draft_steps

    def run(defer_max: int):
        monkeypatch.setattr(drafting, "DEFER_MAX", defer_max)
        engine = eagle_engine(pair_dir[0], max_len=192)   # an untrained head
        forwards = []
        forward = engine.head._forward
        engine.head._forward = lambda batch, f: forwards.append(1) or forward(batch, f)
        # What the head's cache holds, below the position it drafts from, whenever it drafts.
        cached = []

        def drafting_steps(rows, out, s, cache, *rest):
            for k, end, slot in zip(rows.ks, rows.fed_at, rows.read_slots.tolist()):
                if k:
                    cached.append(torch.cat([cache.k[0][slot, :end], cache.v[0][slot, :end]]))
            return steps(rows, out, s, cache, *rest)
        monkeypatch.setattr(drafting, "draft_steps", drafting_steps)
        rounds = []
        # One at a time: a batch's rows space their probes by how many share it.
        got = [generate(engine, None, [Request(p, 96, 6, params, proposer="eagle", auto=True,
                                               reproducible=True)],
                        planner=Planner(8, prior=DEAR), on_round=rounds.append)[0][0]
               for p in prompts()[:4]]
        assert engine.pool.active == 0 and not engine.head.waiting
        return got, rounds, len(forwards), cached

    defer_max = drafting.DEFER_MAX
    every, every_rounds, every_forwards, every_cached = run(0)   # the head writes each round
    waits, wait_rounds, wait_forwards, wait_cached = run(defer_max)
    assert len(wait_cached) == len(every_cached) > 8
    for a, b in zip(wait_cached, every_cached):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert waits == every
    if params.greedy:
        assert [w[:MAX_TOKENS] for w in waits] == greedy[:4]
    drafted = [(r.k, r.accepted, r.proposer, r.failure) for r in every_rounds]
    assert [(r.k, r.accepted, r.proposer, r.failure) for r in wait_rounds] == drafted
    assert sum(r.k == 0 for r in every_rounds) > len(every_rounds) // 2   # off, mostly
    assert any(r.k for r in every_rounds)                                 # and probed
    # The pairs a probe's round writes first: its committed tokens that waited.
    assert sum(r.draft_fed for r in wait_rounds) > sum(r.draft_fed for r in every_rounds)
    assert wait_forwards < every_forwards / 2


@pytest.fixture(scope="module")
def head_dir(pair_dir, tmp_path_factory):
    return trained_head_dir(pair_dir[0], tmp_path_factory.mktemp("head") / "head")


@pytest.fixture(scope="module")
def greedy(pair_dir):
    return transformers_greedy(pair_dir[0], prompts())


def trained_engine(pair_dir, head_dir, **kw):
    model = load_model(pair_dir[0], torch.float64, CPU)
    return eagle_engine(pair_dir[0], load_head(head_dir, model, torch.float64, CPU), **kw)


@pytest.mark.parametrize("k,auto,proposer", [(1, False, "eagle"), (3, False, "eagle"),
                                             (6, False, "eagle"), (8, True, "eagle"),
                                             (4, False, "hybrid"), (8, True, "hybrid")])
def test_greedy_equals_target_alone(pair_dir, head_dir, greedy, k, auto, proposer):
    engine = trained_engine(pair_dir, head_dir)
    rounds = []
    results = generate(engine, None, [Request(p, MAX_TOKENS, k, auto=auto, proposer=proposer)
                                      for p in prompts()],
                       planner=Planner(8) if auto else None, on_round=rounds.append,
                       ngram=NgramProposer())
    assert [r[0] for r in results] == greedy
    drafted = sum(r.k for r in rounds if r.proposer == "eagle")
    accepted = sum(r.accepted for r in rounds if r.proposer == "eagle")
    assert 0 < accepted < drafted   # the head is neither always right nor always wrong
    assert sum(len(r[1].accepted_per_round) for r in results) < len(prompts()) * MAX_TOKENS
    assert engine.pool.active == 0 and not engine.q


def test_a_proposal_drafted_after_a_prefill_is_not_a_steady_cost(pair_dir, head_dir):
    """The head's first proposal comes out of the prompt's verification, after a catch-up over
    the whole prompt: its round reports that catch-up (draft_fed), so the policy's cost fit
    leaves it out as it does a draft model's prefill; later proposals follow one-token
    catch-ups."""
    rounds = []
    prompt = prompts()[0]
    generate(trained_engine(pair_dir, head_dir), None,
             [Request(prompt, 24, 3, proposer="eagle")], on_round=rounds.append)
    drafting = [r for r in rounds if r.k]
    assert drafting[0].draft_fed == len(prompt) > 2
    assert all(r.draft_fed <= 2 for r in drafting[1:]) and len(drafting) > 2


def test_rounds_report_the_width_of_the_batch_they_shared(pair_dir, head_dir):
    """A row drafting 2 verified beside one drafting 5 waits for five drafts' verification and
    for five head steps: its rounds say so (the policy fits costs on that width)."""
    rounds = []
    generate(trained_engine(pair_dir, head_dir), None,
             [Request(p, 24, k, proposer="eagle") for p, k in zip(prompts(2), (2, 5))],
             on_round=rounds.append)
    narrow = [r for r in rounds if r.k == 2 and not r.prefill]
    assert narrow and all(r.batch_k >= 2 for r in narrow)
    assert any(r.batch_k == 5 for r in narrow) and any(r.drafted == 5 for r in narrow)


def test_rows_batched_equal_rows_alone_when_sampling(pair_dir, head_dir):
    engine = trained_engine(pair_dir, head_dir)
    reqs = [Request(p, 16, 4, SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=i),
                    proposer="eagle") for i, p in enumerate(prompts(8))]
    together = [r[0] for r in generate(engine, None, reqs)]
    alone = [generate(engine, None, [r])[0][0] for r in reqs]
    assert together == alone
    assert len({tuple(t) for t in together}) == len(reqs)


def test_a_failing_head_costs_its_proposals_never_the_output(pair_dir, head_dir, greedy):
    """Every other head run fails: those rounds go on target-only, the output is exact."""
    engine = trained_engine(pair_dir, head_dir)
    calls = iter(range(10**6))
    fail_drafters(engine, lambda: RuntimeError("injected") if next(calls) % 2 else None)
    rounds = []
    results = generate(engine, None, [Request(p, MAX_TOKENS, 4, proposer="eagle")
                                      for p in prompts()], on_round=rounds.append)
    assert [r[0] for r in results] == greedy
    assert sum(r.in_target_failure == "error" for r in rounds) > 5
    assert sum(r.accepted for r in rounds) > 0       # the head still drafts between failures
    assert engine.pool.active == 0


def test_cancelled_sequences_release_the_heads_state(pair_dir, head_dir):
    engine = trained_engine(pair_dir, head_dir)
    seen = []

    def cancelled():
        return len(seen) >= 2

    reqs = [Request(p, 40, 4, SamplingParams(temperature=1.0, seed=i), proposer="eagle")
            for i, p in enumerate(prompts(4))]
    results = generate(engine, None, reqs, cancelled=cancelled,
                       on_round=seen.append)
    assert all(r[2][-1].finish_reason == "cancelled" for r in results)
    assert engine.pool.active == 0 and not engine.q


@pytest.mark.parametrize("flash", [False, True])
def test_head_steps_through_the_graphed_path_equal_the_eager_path(pair_dir, head_dir, greedy,
                                                                  flash):
    """The padded, static-shape forwards that CUDA graphs replay (capture=False: the same path,
    run eagerly), for the head's catch-ups and draft steps as for the target: the same rounds,
    the same tokens, greedy and sampled."""
    eager, fast = trained_engine(pair_dir, head_dir), trained_engine(pair_dir, head_dir)
    if flash:
        fast.model.flash = fast.head.head.flash = reference_flash_with_kvcache
    fast.graphs = GraphedForward(fast.model, fast.cache, 4, capture=False)
    fast.head.graphed(capture=False)
    reqs = [Request(p, MAX_TOKENS, 4, proposer="eagle") for p in prompts()]
    reqs += [Request(p, 16, 3, SamplingParams(temperature=0.9, top_p=0.95, seed=i),
                     proposer="eagle") for i, p in enumerate(prompts(6))]
    runs = []
    for engine in (eager, fast):
        rounds = []
        results = generate(engine, None, reqs, on_round=rounds.append)
        runs.append(([r[0] for r in results], [(r.k, r.accepted) for r in rounds]))
    assert runs[0][0][:len(greedy)] == greedy
    assert runs[1] == runs[0]
    keys = set(fast.head.graphs.graphs)
    assert (1, 1) in keys and any(b > 1 and t == 1 for b, t in keys)   # draft steps
    assert any(t > 1 for _, t in keys)                                  # catch-ups


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captured_head_graphs_keep_greedy_exact(pair_dir, head_dir, greedy):
    dev = torch.device("cuda")
    model = load_model(pair_dir[0], torch.float32, dev)
    engine = Engine(model, len(prompts()), 128, dev, cuda_graphs=True,
                    head=HeadDrafter(load_head(head_dir, model, torch.float32, dev)))
    assert engine.head.graphs.graphs[(1, 1)].graph is not None   # captured at load
    results = generate(engine, None, [Request(p, MAX_TOKENS, 4, proposer="eagle")
                                      for p in prompts()])
    assert [r[0] for r in results] == greedy
    assert all(g.graph is not None for g in engine.head.graphs.graphs.values())


def test_the_heads_layers_run_the_cpus_kernels_where_the_targets_do():
    """On the CPU the head's linear layers are packed for the CPU's kernel as the target's are
    (unpacked, in bfloat16 PyTorch's own matrix products made a probe's catch-up cost more
    than the target's step), and it drafts the same greedy tokens as unpacked."""
    root = Path(__file__).resolve().parents[2] / "models" / "default"
    checkpoint = HeadCheckpoint(str(root / "eagle"))
    packed = Engine.load(str(root / "target"), 2, 128, torch.float32, CPU, head=checkpoint)
    plain = Engine.load(str(root / "target"), 2, 128, torch.float32, CPU, head=checkpoint,
                        cpu_kernel=False)
    if not packed.cpu_kernel:
        pytest.skip("the CPU's kernels do not build here")
    layers = [m for m in packed.head.head.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 6 and all(m.packed is not None for m in layers)
    assert not any(getattr(m, "packed", None) is not None for m in plain.head.head.modules())
    reqs = [Request(list(range(5, 25)), 24, 4, proposer="eagle")]
    got, want = generate(packed, None, reqs), generate(plain, None, reqs)
    assert got[0][0] == want[0][0]
    assert got[0][1].accepted_per_round == want[0][1].accepted_per_round
