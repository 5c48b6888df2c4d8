"""SWIFT in the target's engine: the target with layers skipped (swift.py) drafts round r + 1
inside the verification of round r (in_target.ColocatedDraft over an Engine of the SkipView).
Temperature 0: output equals transformers' greedy output of the target alone (the embedded
default target, a real-shape one); sampling: the output follows the target's distribution;
under auto a skip set that does not pay turns itself off; a failing drafter costs only its
proposals; $SPECDEC_SELF_SKIP attaches it."""
import sys
from pathlib import Path

import pytest
import torch

from specdec.runtime.engine import Engine
from specdec.proposers.colocated import ColocatedDraft
from specdec.planning.planner import Planner
from specdec.records import Off, Proposer, Request
from specdec.runtime.sampling import SamplingParams
from specdec.serving.drafters import attach
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import InTargetSettings, SettingsError
from specdec.proposers.swift import SkipView
from specdec.runtime.weights import load_model
from specdec.hooks.faults import fail_drafters
from tests.core.conftest import generate
from tests.core.distill_helpers import DEFAULT_TARGET
from tests.core.test_speculative_distribution import (AcceptanceOnly, N, PROMPT, assert_follows,
                                                      chi_square_p, exact_distribution, tally,
                                                      uniform_q)
from tests.core.test_speculative_exact import MAX_TOKENS, prompts, transformers_greedy
from tests.tiny_checkpoints import make_checkpoint

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

CPU = torch.device("cpu")
SELF = Proposer.SELF
LENGTH = 4   # the first token comes from the prefill, which makes the first proposal

pytestmark = pytest.mark.usefixtures("one_thread")


def self_engine(model, skip, max_sequences=32, max_len=128, drafter=ColocatedDraft) -> Engine:
    target = Engine(model, max_sequences, max_len, CPU, cuda_graphs=False)
    drafting = Engine(SkipView(model, skip), max_sequences, max_len, CPU, cuda_graphs=False)
    target.add_drafter(SELF, drafter(drafting))
    return target


def check_greedy(engine, prompt_list, want, k, auto=False, max_tokens=MAX_TOKENS):
    rounds = []
    results = generate(engine, None, [Request(p, max_tokens, k, auto=auto, proposer=SELF)
                                      for p in prompt_list],
                       planner=Planner(8) if auto else None, on_round=rounds.append)
    assert [r[0] for r in results] == want
    drafting = engine.drafters[SELF].engine
    assert engine.pool.active == 0 and drafting.pool.active == 0 and not engine.q
    return rounds


@pytest.fixture(scope="module")
def embedded_greedy():
    return transformers_greedy(DEFAULT_TARGET, prompts(4))


@pytest.mark.parametrize("k,auto", [(1, False), (4, False), (8, True)])
def test_greedy_equals_target_alone_on_the_default_target(embedded_greedy, k, auto):
    model = load_model(DEFAULT_TARGET, torch.float64, CPU)
    rounds = check_greedy(self_engine(model, (2, 4)), prompts(4), embedded_greedy, k, auto)
    drafted = sum(r.k for r in rounds if r.proposer == SELF)
    accepted = sum(r.accepted for r in rounds if r.proposer == SELF)
    assert 0 < accepted < drafted, (accepted, drafted)   # neither always right nor always wrong


def test_greedy_on_a_real_shape_target(tmp_path):
    """Llama 3.2 1B's config scaled to 4 layers of width 256 (4 query heads on 1 KV head, tied
    embeddings), vocabulary 32000, random weights."""
    cfg = {**make_random_pair.scaled(make_random_pair.PRESETS["llama-1b"], 0.125, 32000),
           "num_hidden_layers": 4}
    make_random_pair.write_model(tmp_path / "target", cfg, make_random_pair.DEFAULT_TARGET, 0,
                                 2**31, None, None)
    want = transformers_greedy(tmp_path / "target", prompts(3), 12)
    model = load_model(tmp_path / "target", torch.float64, CPU)
    assert model.args.vocab_size == 32000 and model.args.num_heads > model.args.num_kv_heads
    for skip in [(1,), (1, 2)]:
        rounds = check_greedy(self_engine(model, skip), prompts(3), want, 4, max_tokens=12)
        assert sum(r.k for r in rounds if r.proposer == SELF) > 0


@pytest.fixture(scope="module")
def small_deep(tmp_path_factory):
    """A 5-token vocabulary (every continuation's probability enumerable), 3 layers: the middle
    one is skipped."""
    root = tmp_path_factory.mktemp("small-deep")
    return (make_checkpoint(root / "t", "llama2", vocab_size=5, seed=3, num_hidden_layers=3),
            make_checkpoint(root / "other", "llama2", vocab_size=5, seed=4, num_hidden_layers=3))


def sample(engine, k, params, auto):
    reqs = [Request(PROMPT, LENGTH, k, SamplingParams(params.temperature, params.top_k,
                                                      params.top_p, seed=1_000_003 * i + 7),
                    auto=auto, prefill_alone=False, proposer=SELF) for i in range(N)]
    rounds = []
    results = generate(engine, None, reqs, planner=AcceptanceOnly(k) if auto else None,
                       on_round=rounds.append)
    counts = tally(results)
    proposed = sum(s.total_draft_tokens for _, s, _ in results)
    assert proposed > N and all(r.proposer == SELF for r in rounds if r.k)
    assert engine.pool.active == 0 and not engine.q
    return counts, sum(s.total_accepted_draft_tokens for _, s, _ in results) / proposed


@pytest.mark.parametrize("k,params,auto", [
    (2, SamplingParams(temperature=0.8, top_k=4, top_p=0.9), False),
    (3, SamplingParams(temperature=1.0), True),
])
def test_self_samples_follow_target(small_deep, k, params, auto):
    engine = self_engine(load_model(small_deep[0], torch.float64, CPU), (1,), N, 16)
    counts, rate = sample(engine, k, params, auto)
    assert 0.2 < rate < 0.95, rate   # both the accepted and the rejected path weigh
    assert_follows(counts, small_deep[0], small_deep[1], params, length=LENGTH)


class UniformQ(ColocatedDraft):
    """Negative control: samples from the skip view but says q is uniform."""

    def draft(self, v):
        tokens, q = super().draft(v)
        return tokens, uniform_q(q)


def test_a_wrong_q_is_told_apart(small_deep):
    """The test above can fail: the view's drafts verified against another q than the one they
    were drawn from bias the output, and the chi-square test sees it."""
    engine = self_engine(load_model(small_deep[0], torch.float64, CPU), (1,), N, 16, UniformQ)
    params = SamplingParams(temperature=1.0)
    counts, _ = sample(engine, 3, params, False)
    assert chi_square_p(counts, exact_distribution(small_deep[0], params, PROMPT, LENGTH)) < 1e-6


class Counting(ColocatedDraft):
    """Counts the tokens it is asked to draft, used or not, and the rows that asked."""
    asked = rows = 0

    def draft(self, v):
        self.asked += sum(v.ks)
        self.rows += sum(k > 0 for k in v.ks)
        return super().draft(v)


def never_paying(tmp_path):
    """Layer 1's MLP scaled up makes the target's tokens that layer's: the view without it
    almost never agrees with the target."""
    model = load_model(make_checkpoint(tmp_path / "t", "llama2", num_hidden_layers=3, seed=1),
                       torch.float64, CPU)
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight.mul_(40.0)
    return self_engine(model, (1,), drafter=Counting)


def test_auto_turns_a_skip_set_that_does_not_pay_off(tmp_path):
    """Auto then drafts only probes (Off.ACCEPTANCE otherwise); the output stays exact."""
    engine, ps = never_paying(tmp_path), prompts(8)
    plain = generate(engine, None, [Request(p, MAX_TOKENS, 0, proposer=SELF) for p in ps])
    rounds = check_greedy(engine, ps, [r[0] for r in plain], 8, auto=True)
    drafted = [r for r in rounds if r.k]
    assert sum(r.accepted for r in drafted) <= 0.2 * sum(r.k for r in drafted)
    assert len(drafted) < 0.25 * len(rounds)
    assert sum(r.reason == Off.ACCEPTANCE for r in rounds) > 0.5 * len(rounds)


def test_while_off_it_drafts_only_to_probe(tmp_path):
    """Off, a dear drafter is asked for tokens only for the rounds that probe it (policy
    lookahead): not a kept-layer forward every round for drafts thrown away. Its cost in time
    is a benchmark's to show, not a test's."""
    engine, ps = never_paying(tmp_path), prompts(8)
    rounds = []
    generate(engine, None, [Request(p, MAX_TOKENS, 8, auto=True, proposer=SELF) for p in ps],
             planner=Planner(8), on_round=rounds.append)
    used = sum(r.k for r in rounds if r.proposer == SELF)
    drafter = engine.drafters[SELF]
    # Asked every round before (rows == rounds); now the sequences' first proposals, made
    # before any was measured, and the probes.
    assert drafter.rows < 0.35 * len(rounds), (drafter.rows, len(rounds))
    assert drafter.asked < 3 * used + 8 * len(ps), (drafter.asked, used)
    assert used > 0   # it still probes


def test_a_failing_drafter_costs_its_proposals_never_the_output(embedded_greedy):
    """Every other drafting fails: those rounds go on target-only, the output is exact."""
    engine = self_engine(load_model(DEFAULT_TARGET, torch.float64, CPU), (2, 4))
    calls = iter(range(10**6))
    fail_drafters(engine, lambda: RuntimeError("injected") if next(calls) % 2 else None)
    rounds = check_greedy(engine, prompts(4), embedded_greedy, 4)
    assert sum(r.in_target_failure == "error" for r in rounds) > 5
    assert sum(r.accepted for r in rounds) > 0   # it still drafts between failures


def test_served_from_settings():
    """$SPECDEC_SELF_SKIP attaches the skip view to target_model's engine, its pool of the kept
    layers; a skip set the target cannot draft with fails the load naming the setting."""
    def engine():
        return Engine(load_model(DEFAULT_TARGET, torch.float64, CPU), 4, 64, CPU,
                      cuda_graphs=False)

    target, s = engine(), EngineSettings(max_sequences=4, max_seq_len=1024)
    said = attach(target, s, InTargetSettings("separate", "2,4", ""), {}, CPU, torch.float64)
    drafting = target.drafters[SELF].engine
    assert drafting.model.skip == (2, 4) and drafting.model.target is target.model
    assert len(drafting.cache.k) == 4 and drafting.max_len == 1024
    held = sum(t.numel() * t.element_size() for t in drafting.cache.k + drafting.cache.v)
    assert said == ["the target drafting for itself (SWIFT) in target_model's process on cpu: "
                    f"layers 2,4 skipped, 4 of 6 kept, KV {held / 2**20:.0f} MiB"]
    for bad, why in [("0,3", "layer 0 is never skipped"), ("6", "out of range"),
                     ("2,x", "'x' is not a layer index")]:
        with pytest.raises(SettingsError, match=r"self_skip \(SPECDEC_SELF_SKIP\)=") as e:
            attach(engine(), s, InTargetSettings("separate", bad, ""), {}, CPU, torch.float64)
        assert why in str(e.value)
