"""Temperature 0: speculative output equals the target's own greedy output, token for token."""
import pytest
import torch
import transformers

from specdec.records import Request
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines, generate

MAX_TOKENS = 24


def prompts(n=12):
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, 97, (int(l),), generator=gen).tolist()
            for l in torch.randint(1, 30, (n,), generator=gen)]


def transformers_greedy(target_dir, prompts_, max_tokens=MAX_TOKENS) -> list[list[int]]:
    """The target alone, as transformers' generate decodes it greedily."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64)
    out = []
    for p in prompts_:
        ids = ref.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                           eos_token_id=None, pad_token_id=0)
        out.append(ids[0, len(p):].tolist())
    return out


@pytest.fixture(scope="module")
def hf_greedy(pair_dir):
    return transformers_greedy(pair_dir[0], prompts())


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5, 6, 7, 8])
def test_greedy_equals_target_alone(pair_dir, hf_greedy, k):
    target, draft = engines(pair_dir)
    results = generate(target, draft, [Request(p, MAX_TOKENS, k, prefill_alone=False)
                                       for p in prompts()])
    assert [r[0] for r in results] == hf_greedy
    if k:
        stats = [r[1] for r in results]
        accepted = sum(s.total_accepted_draft_tokens for s in stats)
        proposed = sum(s.total_draft_tokens for s in stats)
        # The noisy draft must be neither always right nor always wrong, or the test is idle.
        assert 0 < accepted < proposed
        # Accepted drafts save target passes: fewer rounds than tokens overall.
        assert sum(s.rounds for s in stats) < sum(s.num_output_tokens for s in stats)
    assert target.pool.active == 0 and draft.pool.active == 0


def test_greedy_with_k_chosen_per_round_equals_target_alone(pair_dir, hf_greedy):
    """k follows the acceptance seen (the costs fixed: AcceptanceOnly), not this machine's
    timings, whose draft may not pay here and is then only probed."""
    from tests.core.test_speculative_distribution import AcceptanceOnly
    target, draft = engines(pair_dir)
    planner, rounds = AcceptanceOnly(8), []
    results = generate(target, draft, [Request(p, MAX_TOKENS, 8, auto=True) for p in prompts()],
                       planner=planner, on_round=rounds.append)
    assert [r[0] for r in results] == hf_greedy
    assert len({r.k for r in rounds if r.limit}) >= 3     # the schedule did vary
    assert planner.active == 0


def test_seeded_sampling_with_auto_k_depends_on_its_seed_alone(pair_dir):
    """A seeded sampling request's k schedule comes from its own rounds only (frozen policy):
    the same output alone on a fresh server and among other requests on a seasoned one."""
    from specdec.planning.planner import Planner
    target, draft = engines(pair_dir)
    seeded = [Request(p, 20, 8, SamplingParams(temperature=0.8, seed=40 + i), auto=True,
                      reproducible=True) for i, p in enumerate(prompts(3))]
    alone = [generate(target, draft, [r], planner=Planner(8))[0][0] for r in seeded]
    seasoned = Planner(8)
    others = [Request(p, 24, 8, auto=True) for p in prompts(12)[3:]]
    generate(target, draft, others, planner=seasoned)          # the server has a history
    rounds = []
    mixed = generate(target, draft, others[:4] + seeded, planner=seasoned, on_round=rounds.append)
    assert [r[0] for r in mixed[4:]] == alone
    assert len({r.k for r in rounds if r.limit}) >= 2


def test_rows_batched_equal_rows_alone_when_sampling(pair_dir):
    reqs = [Request(p, 16, 4, SamplingParams(temperature=0.9, top_k=20, top_p=0.95, seed=i))
            for i, p in enumerate(prompts(8))]
    target, draft = engines(pair_dir)
    together = [r[0] for r in generate(target, draft, reqs)]
    alone = [generate(target, draft, [r])[0][0] for r in reqs]
    assert together == alone
    assert len({tuple(t) for t in together}) == len(reqs)  # seeds do differ


def test_stop_eos_and_length(pair_dir):
    target, draft = engines(pair_dir)
    base = generate(target, draft, [Request(prompts()[0], 20, 4)])[0][0]
    stop = tuple(base[5:7])
    eos = base[9]
    first_stop = next(i for i in range(len(base) - 1) if tuple(base[i:i + 2]) == stop)
    (tokens, _, chunks), = generate(target, draft, [Request(prompts()[0], 20, 4, stop=(stop,))])
    assert tokens == base[:first_stop] and chunks[-1].finish_reason == "stop"
    (tokens, _, chunks), = generate(target, draft, [Request(prompts()[0], 20, 4, eos=(eos,))])
    assert tokens == base[:base.index(eos)] and chunks[-1].finish_reason == "eos"
    (tokens, _, chunks), = generate(target, draft, [Request(prompts()[0], 7, 4)])
    assert tokens == base[:7] and chunks[-1].finish_reason == "length"


def test_context_window_ends_generation(pair_dir):
    target, draft = engines(pair_dir, max_len=40)
    p = prompts()[0]
    (tokens, stats, chunks), = generate(target, draft, [Request(p, 100, 8)])
    assert len(p) + len(tokens) == 41 and chunks[-1].finish_reason == "length"
    assert target.pool.active == 0


class Scripted:
    """A policy that plays a fixed schedule of k, whatever the request allows."""
    proposers = ("draft",)
    ahead = None   # no drafter in the target's process

    def __init__(self, ks):
        self.ks = iter(ks)

    def choose(self, limit, offers=None):
        from specdec.planning.policy import Choice
        return Choice(min(next(self.ks), limit), "")

    def observe(self, r):
        pass


def test_k_changing_between_rounds_stays_exact(pair_dir, hf_greedy):
    """The draft catches up on whatever it skipped while the policy had speculation off."""
    from specdec.decoding.local import LocalDrafter, LocalVerifier
    from specdec.decoding.loop import speculate
    import asyncio
    target, draft = engines(pair_dir)
    schedule = [4, 0, 0, 3, 8, 0, 1] * 10
    out = []
    asyncio.run(speculate(7, Request(prompts()[0], MAX_TOKENS, 8), LocalDrafter(draft),
                          LocalVerifier(target), target.max_len,
                          lambda c: out.extend(c.tokens), policy=Scripted(schedule)))
    assert out == hf_greedy[0]


def test_prefill_alone_first_then_speculates_exactly(pair_dir, hf_greedy):
    target, draft = engines(pair_dir)
    reqs = [Request(p, MAX_TOKENS, 4) for p in prompts()]
    results = generate(target, draft, reqs)
    assert [r[0] for r in results] == hf_greedy
    for _, stats, chunks in results:
        assert stats.accepted_per_round[0] == 0 and len(chunks[0].tokens) == 1
        assert stats.total_draft_tokens > 0
