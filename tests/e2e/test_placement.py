"""The draft model placed in target_model's process (`target_model_server`,
SPECDEC_TARGET_PLACEMENT=separate), in draft_model (`eagle_server`, SPECDEC_DRAFT_PLACEMENT=
separate), and the target's engine with the draft in speculative_decoding's own process (the
default, `server`): all exact, the same seeded samples, and a round one BLS call in the first,
two in the second, none in the third, as the servers' own metrics count them."""
import subprocess
import sys

import pytest

from specdec_client import GenerationParams, generate, generate_stream
from specdec import names
from specdec.serving import probe
from tests.e2e.conftest import ROOT, heldout_prompts, post, wait_for

PROMPTS = heldout_prompts(2)


def draft(k: int | None, temperature: float = 0.0, seed: int | None = None) -> GenerationParams:
    return GenerationParams(max_tokens=24, temperature=temperature, seed=seed,
                            num_draft_tokens=k, proposer="draft")


@pytest.fixture(scope="module")
def placements(server, eagle_server, target_model_server):
    return {"target": target_model_server, "separate": eagle_server, "orchestrator": server}


@pytest.mark.parametrize("k", [4, None])   # None: auto
def test_greedy_equals_target_only_in_both_placements(placements, k):
    for prompt in PROMPTS:
        plain = generate(placements["target"].http, prompt, draft(0)).text
        for name, s in placements.items():
            got = generate(s.http, prompt, draft(k))
            assert got.text == plain, name
            # Auto drafts where its measured costs say drafting pays: hosted, no BLS call
            # a round makes a target-only round cheap, and on this CPU the co-located draft's
            # steps (about a millisecond a token) then barely pay; it may draft nothing.
            assert got.total_draft_tokens > 0 or (k is None and name == "orchestrator")


def test_seeded_samples_are_the_same_in_both_placements(placements):
    """The co-located draft draws its drafts at the same seeded positions as draft_model, and
    the target verifies them with the same q, so every token matches."""
    for i, prompt in enumerate(PROMPTS):
        params = draft(3, temperature=0.9, seed=100 + i)
        got = {name: generate(s.http, prompt, params) for name, s in placements.items()}
        for other in ("separate", "orchestrator"):
            assert got["target"].text == got[other].text, other
            assert got["target"].total_draft_tokens == got[other].total_draft_tokens > 0
            assert got["target"].total_accepted_draft_tokens == \
                got[other].total_accepted_draft_tokens


def test_calls_per_round_by_placement(placements):
    for s in placements.values():
        generate(s.http, PROMPTS[0], draft(3))
    colocated, separate = placements["target"], placements["separate"]
    hosted = placements["orchestrator"]
    assert wait_for(lambda: colocated.metric("specdec_bls_calls_per_round", proposer="draft",
                                             placement="target") == 1.0)
    assert wait_for(lambda: separate.metric("specdec_bls_calls_per_round", proposer="draft",
                                            placement="draft_model") == 2.0)
    assert wait_for(lambda: hosted.metric("specdec_bls_calls_per_round", proposer="draft",
                                          placement="target") == 0.0)
    # The hosting process shows target_model's slots and the draft's beside them.
    slots = hosted.metric("specdec_kv_slots_total", model="target_model")
    assert slots > 0 and \
        hosted.metric("specdec_kv_slots_total", model="draft_model", placement="target") == slots
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


def test_a_hosted_targets_model_refuses_calls_and_the_probes_pass(server):
    """target_model loads nothing and says where its engine runs; `specdec probe --all` takes
    that refusal as an answer (the orchestrator's generate proves the engine)."""
    status, reply = post(server, f"/v2/models/{names.TARGET_MODEL}/infer",
                         {"inputs": probe.INFER[names.TARGET_MODEL]})
    assert status == 400 and "SPECDEC_TARGET_PLACEMENT" in reply.get("error", ""), reply
    done = subprocess.run([sys.executable, "-m", "specdec.cli", "probe", "--all", "--url",
                           f"http://{server.http}", "--timeout", "30"],
                          cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{names.TARGET_MODEL}: ok" in done.stdout, done.stdout


def test_the_models_that_load_nothing_hold_no_torch(server, target_model_server):
    """By default target_model and draft_model load nothing (the engines run in
    speculative_decoding): their processes import no torch (about 3.5 s of every start on our
    2 vCPUs, 350 MB each). Where they serve, they do."""
    def holds_torch(s, model):
        return "libtorch" in open(f"/proc/{s.backend_pid(model)}/maps").read()
    for model in (names.TARGET_MODEL, names.DRAFT_MODEL):
        assert not holds_torch(server, model), model
    assert holds_torch(server, names.ORCHESTRATOR)
    assert holds_torch(target_model_server, names.TARGET_MODEL)
