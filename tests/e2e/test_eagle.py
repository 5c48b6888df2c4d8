"""A real tritonserver with an EAGLE-3 head in target_model (SPECDEC_EAGLE_HEAD,
SPECDEC_TARGET_PLACEMENT=separate) beside the draft model in draft_model (conftest.eagle_server): the head's proposals come back with each verification, the output is the target's own,
the served rounds are the in-process loop's, a round with the head is one BLS call (two with the
draft model), and a head that fails costs only its proposals."""
import pytest
import torch
from transformers import AutoTokenizer

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.checkpoint import HeadCheckpoint
from specdec.records import Request
from specdec_client import GenerationParams, generate
from tests.core.conftest import generate as generate_in_process
from tests.core.distill_helpers import DEFAULT_TARGET
from tests.e2e.conftest import EAGLE_FAULTS as FAULTS
from tests.e2e.conftest import EAGLE_HEAD, heldout_prompts, wait_for

PROMPTS = heldout_prompts(2)


@pytest.fixture(scope="module")
def head():
    """The shipped head: `specdec distill --method eagle3` on the default target, defaults."""
    return EAGLE_HEAD


def test_a_failing_head_costs_only_its_proposals(eagle_server):
    """The fault script fails the head's first runs inside verifications that stand."""
    for prompt in PROMPTS:
        spec = generate(eagle_server.http, prompt, GenerationParams(
            max_tokens=16, temperature=0.0, num_draft_tokens=4, proposer="eagle"))
        plain = generate(eagle_server.http, prompt, GenerationParams(
            max_tokens=16, temperature=0.0, num_draft_tokens=0))
        assert spec.text == plain.text and spec.finish_reason == "length"
    assert wait_for(lambda: eagle_server.metric("specdec_draft_failures_total",
                                                reason="error") == FAULTS)


def test_served_rounds_are_the_in_process_loops(eagle_server, head):
    cpu = torch.device("cpu")
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    target = Engine.load(str(DEFAULT_TARGET), 2, 128, torch.float32, cpu,
                         head=HeadCheckpoint(str(head)))
    eos = ModelArgs.from_dir(DEFAULT_TARGET).eos_token_ids
    local = generate_in_process(target, None, [
        Request(tokenizer(p)["input_ids"], 32, 4, eos=eos, proposer="eagle") for p in PROMPTS])
    for prompt, (tokens, stats, _) in zip(PROMPTS, local):
        spec = generate(eagle_server.http, prompt, GenerationParams(
            max_tokens=32, temperature=0.0, num_draft_tokens=4, proposer="eagle"))
        assert spec.text == tokenizer.decode(tokens)
        assert spec.total_draft_tokens == stats.total_draft_tokens
        assert spec.total_accepted_draft_tokens == stats.total_accepted_draft_tokens > 0


@pytest.mark.parametrize("params", [
    GenerationParams(max_tokens=24, temperature=0.0, proposer="eagle"),          # auto k
    GenerationParams(max_tokens=24, temperature=0.0, num_draft_tokens=6, proposer="hybrid"),
    GenerationParams(max_tokens=24, temperature=0.0),                            # the default
])
def test_greedy_equals_the_target_alone(eagle_server, params):
    for prompt in PROMPTS:
        got = generate(eagle_server.http, prompt, params)
        plain = generate(eagle_server.http, prompt, GenerationParams(
            max_tokens=24, temperature=0.0, num_draft_tokens=0))
        assert got.text == plain.text


def test_bls_calls_per_round_one_with_the_head_two_with_the_draft(eagle_server):
    for proposer in ("eagle", "draft"):
        generate(eagle_server.http, PROMPTS[0], GenerationParams(
            max_tokens=16, temperature=0.0, num_draft_tokens=3, proposer=proposer))
    assert wait_for(lambda: eagle_server.metric("specdec_bls_calls_per_round",
                                                proposer="eagle") == 1.0)
    assert eagle_server.metric("specdec_bls_calls_per_round", proposer="draft") == 2.0
    assert eagle_server.metric("specdec_accepted_tokens_total", proposer="eagle") > 0


def test_sampling_with_the_heads_q_is_seeded(eagle_server):
    params = GenerationParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=11,
                              num_draft_tokens=3, proposer="eagle")
    a, b = (generate(eagle_server.http, PROMPTS[1], params) for _ in range(2))
    assert a.text == b.text and a.num_output_tokens == 16
    assert a.total_draft_tokens > 0
