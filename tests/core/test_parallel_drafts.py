"""Parallel drafts (PARD, specdec/runtime/parallel_drafts.py): K proposals from one pass over the
committed tokens and K-1 mask tokens, the mask rows' KV dropped; exact output whatever the draft
proposes, greedy and sampled, beside the target or in its process, alone and in hybrid."""
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from specdec.runtime.config import CheckpointError
from specdec.runtime.engine import Engine
from specdec.proposers.colocated import ColocatedDraft
from specdec.proposers.ngram import NgramProposer
from specdec.records import ProposeCall, Proposer, Request
from specdec.runtime.sampling import SamplingParams
from specdec.runtime.weights import load_model
from tests.core.conftest import engines, generate
from tests.core.test_colocated_draft import ColocatedPlanner
from tests.core.test_speculative_distribution import (LENGTH, N, PROMPT, AcceptanceOnly,
                                                      assert_follows, tally)
from tests.core.test_speculative_exact import MAX_TOKENS, prompts

CPU = torch.device("cpu")


def make_parallel(draft: Path, out: Path, mask: int) -> Path:
    """The draft as a PARD checkpoint: the same weights, config.json naming a mask token."""
    if not out.exists():
        shutil.copytree(draft, out)
        cfg = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps({**cfg, "pard_token": mask}))
    return out


@pytest.fixture(scope="module")
def pard_pair(pair_dir, tmp_path_factory):
    target, draft = pair_dir
    return target, make_parallel(draft, tmp_path_factory.mktemp("pard") / "d", 96)


@pytest.fixture(scope="module")
def small_pard(small_pair, tmp_path_factory):
    target, draft = small_pair
    return target, make_parallel(draft, tmp_path_factory.mktemp("small_pard") / "d", 4)


def hf_parallel(path: Path, tokens: list[int], mask: int, k: int) -> torch.Tensor:
    """The k proposals' distributions [k, V] as transformers reads them: one forward over
    tokens and k-1 masks."""
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    with torch.no_grad():
        logits = model(torch.tensor([tokens + [mask] * (k - 1)])).logits[0]
    logits[:, mask] = float("-inf")   # never proposed
    return logits[len(tokens) - 1:].softmax(-1)


def proposes(draft: Engine, call: ProposeCall, expected: torch.Tensor) -> list[int]:
    """The call's proposal, checked against transformers' distributions: greedy, its argmax;
    sampled at temperature 1, drawn from q equal to them."""
    [sampled] = draft.propose([replace(call, sampling=SamplingParams(1.0, seed=3))])
    torch.testing.assert_close(sampled.probs.double(), expected, atol=1e-6, rtol=0)
    [greedy] = draft.propose([call])   # the drafts it claims next: the greedy ones
    assert greedy.tokens == expected.argmax(-1).tolist()
    return greedy.tokens


def test_one_pass_proposes_what_transformers_reads_and_feeds_accepted_drafts_later(pard_pair):
    _, path = pard_pair
    draft = Engine(load_model(path, torch.float64, CPU), 4, 64, CPU)
    assert draft.parallel is not None
    prompt = prompts()[0]
    first = proposes(draft, ProposeCall(7, 0, prompt, 5, SamplingParams()),
                     hf_parallel(path, prompt, 96, 5))
    assert draft.pool.lengths[7] == len(prompt) + 4        # claims d_1..d_4, as a draft does
    # Two drafts accepted, then the target's own token: d_1, d_2 are fed in the next pass.
    seen = prompt + first[:2] + [11]
    proposes(draft, ProposeCall(7, len(prompt) + 2, [11], 3, SamplingParams()),
             hf_parallel(path, seen, 96, 3))
    # None accepted: the claimed drafts are not fed; the cache still holds the prompt.
    proposes(draft, ProposeCall(7, len(prompt), [5], 4, SamplingParams()),
             hf_parallel(path, prompt + [5], 96, 4))
    draft.release([7])
    assert not draft.parallel.claimed and draft.pool.active == 0


def test_a_mask_token_outside_the_vocabulary_is_refused(pair_dir, tmp_path):
    path = make_parallel(pair_dir[1], tmp_path / "d", 10 ** 6)
    with pytest.raises(CheckpointError, match="pard_token 1000000 is not a token id below"):
        load_model(path, torch.float32, CPU)


@pytest.fixture(scope="module")
def hf_greedy(pair_dir):
    from tests.core.test_speculative_exact import transformers_greedy
    return transformers_greedy(pair_dir[0], prompts())


@pytest.mark.parametrize("k,auto,where", [(1, False, "apart"), (4, False, "apart"),
                                          (8, True, "apart"), (4, False, "in target"),
                                          (6, True, "in target")])
def test_greedy_with_parallel_drafts_is_the_target_alone(pard_pair, hf_greedy, k, auto, where):
    target, draft = engines(pard_pair)
    reqs = [Request(p, MAX_TOKENS, k, auto=auto) for p in prompts()]
    rounds = []
    if where == "apart":
        results = generate(target, draft, reqs, planner=AcceptanceOnly(8) if auto else None,
                           on_round=rounds.append)
    else:
        target.add_drafter(Proposer.DRAFT, ColocatedDraft(draft))
        results = generate(target, None, reqs, planner=ColocatedPlanner(8) if auto else None,
                           on_round=rounds.append)
    assert [r[0] for r in results] == hf_greedy
    drafted = [r for r in rounds if r.k]
    accepted = sum(r.accepted for r in drafted)
    assert 0 < accepted < sum(r.k for r in drafted)      # neither path idle
    assert target.pool.active == 0 and draft.pool.active == 0 and not draft.parallel.claimed


@pytest.mark.parametrize("proposer,k", [("draft", 3), ("hybrid", 3)])
def test_sampling_with_parallel_drafts_follows_the_target(small_pard, proposer, k):
    """Alone, and in hybrid beside prompt lookup (a prompt that repeats, so lookup proposes),
    every request of a batch sampled with its own seed."""
    params = SamplingParams(temperature=1.0)
    prompt = PROMPT if proposer == "draft" else [0, 3, 4, 0, 3]
    target, draft = engines(small_pard, max_sequences=N, max_len=16)
    reqs = [Request(prompt, LENGTH, k, SamplingParams(1.0, seed=1_000_003 * i + 7),
                    auto=proposer == "hybrid", prefill_alone=False, proposer=proposer)
            for i in range(N)]
    rounds = []
    results = generate(target, draft, reqs, on_round=rounds.append, ngram=NgramProposer(),
                       planner=AcceptanceOnly(k) if proposer == "hybrid" else None)
    by = {p: sum(r.k for r in rounds if r.proposer == p) for p in ("draft", "ngram")}
    assert by["draft"] > N // 2, by
    if proposer == "hybrid":
        assert by["ngram"] > N // 10, by                   # both proposers carry weight
    rate = sum(s.total_accepted_draft_tokens for _, s, _ in results) / sum(
        s.total_draft_tokens for _, s, _ in results)
    assert 0.15 < rate < 0.95, rate
    assert_follows(tally(results), small_pard[0], small_pard[1], params, prompt)
