"""Speculation with Medusa-1 heads in the target's engine: the verification of round r drafts
round r + 1's k tokens from k heads at once. Temperature 0: output equals transformers' greedy
output of the target alone (a tiny target, the embedded default one, a real-shape one);
sampling: the output follows the target's distribution, each head's q verified where it was
made; a failing drafter costs only its proposals."""
import sys
from pathlib import Path

import pytest
import torch

from specdec.distill import data, medusa
from specdec.runtime.engine import Engine
from specdec.proposers.medusa.checkpoint import load_medusa, save_medusa
from specdec.proposers.medusa.config import MedusaArgs
from specdec.proposers.medusa.drafting import MedusaDrafter
from specdec.proposers.medusa.head import MedusaHead
from specdec.planning.planner import Planner
from specdec.records import Proposer, Request
from specdec.runtime.sampling import SamplingParams
from specdec.serving.drafters import attach
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import InTargetSettings, SettingsError
from specdec.runtime.weights import load_model
from specdec.hooks.faults import fail_drafters
from tests.core.conftest import generate
from tests.core.distill_helpers import DEFAULT_TARGET
from tests.core.test_speculative_distribution import (AcceptanceOnly, N, PROMPT, assert_follows,
                                                      chi_square_p, exact_distribution, tally,
                                                      uniform_q)
from tests.core.test_speculative_exact import MAX_TOKENS, prompts, transformers_greedy

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

CPU = torch.device("cpu")
MEDUSA = Proposer.MEDUSA
LENGTH = 4   # the first token comes from the prefill, which makes the first proposal

pytestmark = pytest.mark.usefixtures("one_thread")


def medusa_engine(target_dir, head=None, max_sequences=32, max_len=128, dtype=torch.float64):
    model = load_model(target_dir, dtype, CPU)
    engine = Engine(model, max_sequences, max_len, CPU, cuda_graphs=False)
    engine.add_drafter(MEDUSA, MedusaDrafter(head or random_heads(model), engine.vocab_size))
    return engine


def random_heads(model, heads=3, seed=0, sharpen=4.0) -> MedusaHead:
    """Untrained heads over the whole vocabulary, their logits sharpened so that q is far from
    uniform: they agree with the target some of the time, by chance."""
    a = model.args
    torch.manual_seed(seed)
    head = MedusaHead(MedusaArgs(heads, 1, a.hidden_size, a.vocab_size)).to(
        model.lm_head.weight.dtype)
    with torch.no_grad():
        for layers in head.heads:
            layers[-1].weight.normal_().mul_(sharpen / a.hidden_size ** 0.5)
    return head.eval().requires_grad_(False)


def trained_heads(target_dir, out_dir, steps=30, sequences=64, new_tokens=24, batch=16,
                  seed=0) -> Path:
    """Heads trained on the target's own continuations of random prompts (half greedy, half
    sampled), written in FasterDecoding's layout."""
    model = load_model(target_dir, torch.float32, CPU)
    vocab = min(model.args.vocab_size, 4096)
    gen = torch.Generator().manual_seed(seed)
    prompt_list = [torch.randint(0, vocab, (int(n),), generator=gen).tolist()
                   for n in torch.randint(2, 12, (sequences,), generator=gen)]
    engine = Engine(model, 16, 12 + new_tokens, CPU, cuda_graphs=False)
    rows, lengths = data.training_rows(engine, prompt_list, sequences, new_tokens, 0.5, 1.0,
                                       seed, ())
    head = medusa.train_heads(engine, [r[:n].tolist() for r, n in zip(rows, lengths)], steps,
                              heads=4, batch=batch, seed=seed)
    save_medusa(head, out_dir, str(target_dir))
    return out_dir


@pytest.fixture(scope="module")
def pair_heads(pair_dir, tmp_path_factory):
    return trained_heads(pair_dir[0], tmp_path_factory.mktemp("medusa") / "heads")


@pytest.fixture(scope="module")
def greedy(pair_dir):
    return transformers_greedy(pair_dir[0], prompts())


def served(target_dir, heads_dir, **kw) -> Engine:
    model = load_model(target_dir, torch.float64, CPU)
    head = load_medusa(heads_dir, model.args, torch.float64, CPU)
    return medusa_engine(target_dir, head, **kw)


def _check_greedy(engine, prompt_list, want, k, auto, proposer=MEDUSA):
    rounds = []
    results = generate(engine, None, [Request(p, MAX_TOKENS, k, auto=auto, proposer=proposer)
                                      for p in prompt_list],
                       planner=Planner(8) if auto else None, on_round=rounds.append)
    assert [r[0] for r in results] == want
    drafted = sum(r.k for r in rounds if r.proposer == MEDUSA)
    accepted = sum(r.accepted for r in rounds if r.proposer == MEDUSA)
    assert 0 < accepted < drafted, (accepted, drafted)   # neither always right nor always wrong
    assert max(r.k for r in rounds) <= 4                 # one token a head
    assert engine.pool.active == 0 and not engine.q
    return rounds


@pytest.mark.parametrize("k,auto", [(1, False), (3, False), (6, False), (8, True)])
def test_greedy_equals_target_alone(pair_dir, pair_heads, greedy, k, auto):
    _check_greedy(served(pair_dir[0], pair_heads), prompts(), greedy, k, auto)


def test_greedy_on_the_default_target(tmp_path):
    heads = trained_heads(DEFAULT_TARGET, tmp_path / "heads", steps=10, sequences=32,
                          batch=8)
    want = transformers_greedy(DEFAULT_TARGET, prompts(4))
    _check_greedy(served(DEFAULT_TARGET, heads), prompts(4), want, 4, False)


def test_greedy_on_a_real_shape_target(tmp_path):
    """Llama 3.2 1B's config scaled to one layer of width 256 (4 query heads on 1 KV head, tied
    embeddings), vocabulary 32000, random weights; heads as distill starts them, perturbed."""
    cfg = make_random_pair.scaled(make_random_pair.PRESETS["llama-1b"], 0.0625, 32000)
    make_random_pair.write_model(tmp_path / "target", cfg, make_random_pair.DEFAULT_TARGET, 0,
                                 2**31, None, None)
    model = load_model(tmp_path / "target", torch.float64, CPU)
    head = medusa.new_heads(model, 4, 1).double()
    with torch.no_grad():
        for layers in head.heads:
            layers[0].linear.weight.normal_(0, 0.02)
    save_medusa(head, tmp_path / "heads", str(tmp_path / "target"))
    want = transformers_greedy(tmp_path / "target", prompts(3), 12)
    engine = served(tmp_path / "target", tmp_path / "heads")
    results = generate(engine, None, [Request(p, 12, 4, proposer=MEDUSA) for p in prompts(3)])
    assert [r[0] for r in results] == want
    assert sum(s.total_draft_tokens for _, s, _ in results) > 0


@pytest.mark.parametrize("k,params,auto", [
    (3, SamplingParams(temperature=1.0), False),
    (2, SamplingParams(temperature=0.8, top_k=4, top_p=0.9), False),
    (3, SamplingParams(temperature=1.0), True),
])
def test_medusa_samples_follow_target(small_pair, k, params, auto):
    engine = medusa_engine(small_pair[0], max_sequences=N, max_len=16)
    counts, rate = _sample(engine, k, params, auto)
    assert 0.2 < rate < 0.95, rate   # both the accepted and the rejected path weigh
    assert_follows(counts, small_pair[0], small_pair[1], params, length=LENGTH)
    assert engine.pool.active == 0 and not engine.q


class UniformQ(MedusaDrafter):
    """Negative control: samples from the heads but says q is uniform."""

    def draft(self, v):
        tokens, q = super().draft(v)
        return tokens, uniform_q(q)


def test_a_wrong_q_is_told_apart(small_pair):
    """The test above can fail: verifying the heads' drafts against another q than the one they
    were drawn from biases the output, and the chi-square test sees it."""
    engine = medusa_engine(small_pair[0], max_sequences=N, max_len=16)
    engine.drafters[MEDUSA] = UniformQ(engine.drafters[MEDUSA].head, engine.vocab_size)
    params = SamplingParams(temperature=1.0)
    counts, _ = _sample(engine, 3, params, False)
    assert chi_square_p(counts, exact_distribution(small_pair[0], params, PROMPT, LENGTH)) < 1e-6


def _sample(engine, k, params, auto):
    reqs = [Request(PROMPT, LENGTH, k, SamplingParams(params.temperature, params.top_k,
                                                      params.top_p, seed=1_000_003 * i + 7),
                    auto=auto, prefill_alone=False, proposer=MEDUSA) for i in range(N)]
    rounds = []
    results = generate(engine, None, reqs, planner=AcceptanceOnly(k) if auto else None,
                       on_round=rounds.append)
    counts = tally(results)
    proposed = sum(s.total_draft_tokens for _, s, _ in results)
    assert proposed > 1.5 * N and all(r.proposer == MEDUSA for r in rounds if r.k)
    return counts, sum(s.total_accepted_draft_tokens for _, s, _ in results) / proposed


def test_a_failing_drafter_costs_its_proposals_never_the_output(pair_dir, pair_heads, greedy):
    """Every other drafting fails: those rounds go on target-only, the output is exact."""
    engine = served(pair_dir[0], pair_heads)
    calls = iter(range(10**6))
    fail_drafters(engine, lambda: RuntimeError("injected") if next(calls) % 2 else None)
    rounds = []
    results = generate(engine, None, [Request(p, MAX_TOKENS, 4, proposer=MEDUSA)
                                      for p in prompts()], on_round=rounds.append)
    assert [r[0] for r in results] == greedy
    assert sum(r.in_target_failure == "error" for r in rounds) > 5
    assert sum(r.accepted for r in rounds) > 0   # the heads still draft between failures
    assert engine.pool.active == 0


def test_served_from_settings(pair_dir, pair_heads, tmp_path):
    """$SPECDEC_MEDUSA_HEADS attaches the heads to target_model's engine; heads that do not fit
    the target fail the load naming the setting and the field."""
    def engine():
        return Engine(load_model(pair_dir[0], torch.float64, CPU), 4, 64, CPU, cuda_graphs=False)

    def settings(path):
        return InTargetSettings("separate", "", str(path))

    target = engine()
    said = attach(target, EngineSettings(), settings(pair_heads), {}, CPU, torch.float64)
    assert said == [f"4 Medusa-1 heads {pair_heads} in target_model's process on cpu"]
    assert isinstance(target.drafters[MEDUSA], MedusaDrafter)
    save_medusa(MedusaHead(MedusaArgs(2, 1, 64, 50)), tmp_path / "other", "another model")
    with pytest.raises(SettingsError, match=r"medusa_heads_path \(SPECDEC_MEDUSA_HEADS\): .*"
                       r"config.json: vocab_size 50 does not fit the target's vocab_size 97"):
        attach(engine(), EngineSettings(), settings(tmp_path / "other"), {}, CPU, torch.float64)
