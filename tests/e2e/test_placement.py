"""The draft model placed in target_model's process (the default, `server`) and in draft_model
(`eagle_server`, SPECDEC_DRAFT_PLACEMENT=separate): both exact, the same seeded samples, and a
round one BLS call in the first, two in the second, as the servers' own metrics count them
(issue 29)."""
import pytest

from specdec_client import GenerationParams, generate, generate_stream
from tests.e2e.conftest import heldout_prompts, wait_for

PROMPTS = heldout_prompts(2)


def draft(k: int | None, temperature: float = 0.0, seed: int | None = None) -> GenerationParams:
    return GenerationParams(max_tokens=24, temperature=temperature, seed=seed,
                            num_draft_tokens=k, proposer="draft")


@pytest.fixture(scope="module")
def placements(server, eagle_server):
    return {"target": server, "separate": eagle_server}


@pytest.mark.parametrize("k", [4, None])   # None: auto
def test_greedy_equals_target_only_in_both_placements(placements, k):
    for prompt in PROMPTS:
        plain = generate(placements["target"].http, prompt, draft(0)).text
        for name, s in placements.items():
            got = generate(s.http, prompt, draft(k))
            assert got.text == plain, name
            assert got.total_draft_tokens > 0


def test_seeded_samples_are_the_same_in_both_placements(placements):
    """The co-located draft draws its drafts at the same seeded positions as draft_model, and
    the target verifies them with the same q, so every token matches."""
    for i, prompt in enumerate(PROMPTS):
        params = draft(3, temperature=0.9, seed=100 + i)
        got = {name: generate(s.http, prompt, params) for name, s in placements.items()}
        assert got["target"].text == got["separate"].text
        assert got["target"].total_draft_tokens == got["separate"].total_draft_tokens > 0
        assert got["target"].total_accepted_draft_tokens == \
            got["separate"].total_accepted_draft_tokens


def test_calls_per_round_by_placement(placements):
    for s in placements.values():
        generate(s.http, PROMPTS[0], draft(3))
    colocated, separate = placements["target"], placements["separate"]
    assert wait_for(lambda: colocated.metric("specdec_bls_calls_per_round", proposer="draft",
                                             placement="target") == 1.0)
    assert wait_for(lambda: separate.metric("specdec_bls_calls_per_round", proposer="draft",
                                            placement="draft_model") == 2.0)
    # draft_model loads nothing where the draft is in target_model, which shows its slots.
    assert colocated.metric("specdec_kv_slots_total", model="draft_model",
                            placement="target") > 0
    assert colocated.metric("specdec_kv_slots_total", model="draft_model") == \
        colocated.metric("specdec_kv_slots_total", model="draft_model", placement="target")


def test_a_cancelled_stream_frees_the_colocated_drafts_slot(server):
    def used():
        return server.metric("specdec_kv_slots_used", model="draft_model", placement="target")
    stream = generate_stream(server.http, PROMPTS[0], GenerationParams(
        max_tokens=1000, num_draft_tokens=4, proposer="draft"))
    next(iter(stream))
    assert wait_for(lambda: used() == 1)
    stream.cancel()
    assert wait_for(lambda: server.metric("specdec_active_sequences") == 0)
    assert wait_for(lambda: used() == 0)
