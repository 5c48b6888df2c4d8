"""Prompt lookup on a real tritonserver: chosen per request, alone or with the draft model, and a
deployment with no draft checkpoint at all (SPECDEC_DRAFT_MODEL=none)."""
from concurrent.futures import ThreadPoolExecutor

import pytest

from specdec_client import GenerationParams, generate, generate_stream, grpc_stream
from tests.e2e.conftest import BATCH_INVARIANT, heldout_prompts, launch, post

# Code that repeats itself: the target continues the pattern, so lookups find matches.
REPEATING = ("def add_one(x):\n    return x + 1\n\n\ndef add_two(x):\n    return x + 2\n\n\n"
             "def add_three(x):\n    return x + 3\n\n\ndef add_four(x):\n")
PROMPTS = [REPEATING] + heldout_prompts(3)


def greedy(**fields) -> GenerationParams:
    return GenerationParams(max_tokens=32, temperature=0.0, **fields)


@pytest.fixture(scope="module")
def no_draft(tmp_path_factory):
    """The same target with no draft model: draft_model loads nothing. Batch-invariant: its
    concurrent requests are compared with the same requests alone (conftest.BATCH_INVARIANT)."""
    yield from launch(tmp_path_factory, {"SPECDEC_DRAFT_MODEL": "none", **BATCH_INVARIANT})


@pytest.fixture(scope="module")
def target_alone(server):
    return [generate(server.http, p, greedy(num_draft_tokens=0)).text for p in PROMPTS]


@pytest.mark.parametrize("proposer", ["ngram", "hybrid", "draft"])
def test_each_proposer_equals_the_target_alone(server, target_alone, proposer):
    results = [generate(server.http, p, greedy(proposer=proposer)) for p in PROMPTS]
    assert [r.text for r in results] == target_alone
    lookups = sum(r.ngram_draft_tokens for r in results)
    if proposer == "draft":
        assert lookups == 0
    if proposer == "ngram":
        assert lookups == sum(r.total_draft_tokens for r in results) > 0
        assert sum(r.ngram_accepted_tokens for r in results) > 0


def test_an_unknown_proposer_is_a_400_naming_the_field(server):
    status, body = post(server, "/v2/models/ensemble/generate",
                        {"text_input": "x", "max_tokens": 4, "proposer": "lookahead"})
    assert status == 400 and "proposer: 'lookahead' is not one of" in body["error"]


def test_a_server_without_a_draft_answers_with_lookup(no_draft, target_alone):
    texts = [generate(no_draft.http, p, greedy()).text for p in PROMPTS]
    assert texts == target_alone
    r = generate(no_draft.http, REPEATING, greedy())
    assert r.ngram_draft_tokens == r.total_draft_tokens > 0
    # Streamed over SSE and gRPC, sampled with a seed: the same text as one response.
    params = GenerationParams(max_tokens=32, temperature=0.7, seed=3)
    whole = generate(no_draft.http, REPEATING, params).text
    assert "".join(generate_stream(no_draft.http, REPEATING, params)) == whole
    assert "".join(grpc_stream(no_draft.grpc, REPEATING, params)) == whole
    # Concurrent requests batch and still equal their single-request answers.
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: generate(no_draft.http, p, greedy()).text, PROMPTS))
    assert together == texts
    assert no_draft.metric("specdec_kv_slots_total", model="draft_model") == 0
    assert no_draft.metric("specdec_draft_tokens_total", proposer="draft") == 0
    assert no_draft.metric("specdec_draft_tokens_total", proposer="ngram") > 0


@pytest.mark.parametrize("proposer", ["draft", "hybrid"])
def test_asking_a_server_without_a_draft_for_one_is_a_400(no_draft, proposer):
    status, body = post(no_draft, "/v2/models/ensemble/generate",
                        {"text_input": "x", "max_tokens": 4, "proposer": proposer})
    assert status == 400
    assert f"proposer: '{proposer}' needs a draft model" in body["error"]
