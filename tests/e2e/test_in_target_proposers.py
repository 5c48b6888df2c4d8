"""The proposers that draft inside the target's verification, served by one real tritonserver
(conftest.distilled_server, beside the distilled draft): Medusa-1 heads made by `specdec distill
--method medusa` (SPECDEC_MEDUSA_HEADS) and SWIFT, the target skipping layers 2 and 4
(SPECDEC_SELF_SKIP). Each request names its proposer. `proposer=medusa` gives the target's own
text over HTTP and gRPC streaming, its rounds are the in-process loop's, sampling with a seed
repeats, and a round is no BLS call (the target's engine, the heads and the skipping beside the
loop in speculative_decoding's process, the default placement); `proposer=self` the same, on
the same server."""
import pytest
import torch
from transformers import AutoTokenizer

from specdec.runtime.config import ModelArgs
from specdec.runtime.engine import Engine
from specdec.proposers.medusa.checkpoint import load_medusa
from specdec.proposers.medusa.drafting import MedusaDrafter
from specdec.records import Proposer, Request
from specdec_client import GenerationParams, generate, grpc_stream
from tests.core.conftest import generate as generate_in_process
from tests.core.distill_helpers import DEFAULT_TARGET
from tests.e2e.conftest import heldout_prompts, wait_for

PROMPTS = heldout_prompts(3)
TOKENS = 24


def greedy(**fields) -> GenerationParams:
    return GenerationParams(max_tokens=TOKENS, temperature=0.0, **fields)


@pytest.fixture(scope="module")
def target_alone(distilled_server):
    return [generate(distilled_server.http, p, greedy(num_draft_tokens=0)).text for p in PROMPTS]


def test_greedy_equals_the_target_alone_over_http_and_grpc(distilled_server, target_alone):
    params = greedy(num_draft_tokens=4, proposer="medusa")
    results = [generate(distilled_server.http, p, params) for p in PROMPTS]
    assert [r.text for r in results] == target_alone
    assert ["".join(grpc_stream(distilled_server.grpc, p, params)) for p in PROMPTS] == target_alone
    assert sum(r.total_draft_tokens for r in results) > 0


def test_served_rounds_are_the_in_process_loops(distilled_server, distilled):
    """The heads as target_model loads them, on the target in this process: the same tokens
    proposed and accepted, request by request."""
    cpu = torch.device("cpu")
    tokenizer = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    margs = ModelArgs.from_dir(DEFAULT_TARGET)
    target = Engine.load(str(DEFAULT_TARGET), 2, 128, torch.float32, cpu)
    heads = load_medusa(distilled[1], margs, torch.float32, cpu)
    target.add_drafter(Proposer.MEDUSA, MedusaDrafter(heads, target.vocab_size))
    local = generate_in_process(target, None, [
        Request(tokenizer(p)["input_ids"], TOKENS, 4, eos=margs.eos_token_ids,
                proposer=Proposer.MEDUSA) for p in PROMPTS[:2]])
    for prompt, (tokens, stats, _) in zip(PROMPTS, local):
        spec = generate(distilled_server.http, prompt, greedy(num_draft_tokens=4,
                                                              proposer="medusa"))
        assert spec.text == tokenizer.decode(tokens)
        assert spec.total_draft_tokens == stats.total_draft_tokens > 0
        assert spec.total_accepted_draft_tokens == stats.total_accepted_draft_tokens


def test_sampling_with_the_heads_q_is_seeded(distilled_server):
    params = GenerationParams(max_tokens=TOKENS, temperature=0.9, top_p=0.95, seed=11,
                              num_draft_tokens=3, proposer="medusa")
    a, b = (generate(distilled_server.http, PROMPTS[1], params) for _ in range(2))
    assert a.text == b.text and a.num_output_tokens == TOKENS and a.total_draft_tokens > 0
    assert "".join(grpc_stream(distilled_server.grpc, PROMPTS[1], params)) == a.text


def test_a_medusa_round_is_no_bls_call(distilled_server):
    generate(distilled_server.http, PROMPTS[0], greedy(num_draft_tokens=4, proposer="medusa"))
    # Rounds drafted (counted in the same flush as the gauge), none of them a BLS call.
    assert wait_for(lambda: distilled_server.metric("specdec_draft_tokens_total",
                                                    proposer="medusa") > 0)
    assert distilled_server.metric("specdec_bls_calls_per_round", proposer="medusa",
                                   placement="target") == 0.0
    assert distilled_server.metric("specdec_drafted_at_position_total", proposer="medusa",
                                   position="4") > 0


def test_self_greedy_equals_the_target_alone_and_sampling_repeats(distilled_server,
                                                                   target_alone):
    params = greedy(num_draft_tokens=4, proposer="self")
    assert ["".join(grpc_stream(distilled_server.grpc, p, params)) for p in PROMPTS] == target_alone
    assert generate(distilled_server.http, PROMPTS[0], params).total_draft_tokens > 0
    sampled = GenerationParams(max_tokens=TOKENS, temperature=0.9, top_p=0.95, seed=5,
                               num_draft_tokens=3, proposer="self")
    a, b = ("".join(grpc_stream(distilled_server.grpc, PROMPTS[2], sampled)) for _ in range(2))
    assert a == b and a


def test_a_self_round_is_no_bls_call(distilled_server):
    generate(distilled_server.http, PROMPTS[1], greedy(num_draft_tokens=4, proposer="self"))
    # Rounds drafted (counted in the same flush as the gauge), none of them a BLS call.
    assert wait_for(lambda: distilled_server.metric("specdec_draft_tokens_total",
                                                    proposer="self") > 0)
    assert distilled_server.metric("specdec_bls_calls_per_round", proposer="self",
                                   placement="target") == 0.0
