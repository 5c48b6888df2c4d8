"""The loop (loop.speculate, batched, with caches and the engine's fused verification) against
its specification, reference.generate (one sequence, no cache, the papers' rule written out):
the same tokens on held-out prompts of the default pair, greedy and seeded sampling, at a fixed
k, all requests batched together. Both draw the server's counter-based randomness, so a sampled
token differs only where the two computed a different distribution or rule."""
import sys
from pathlib import Path

import pytest
import torch

from specdec.decoding import reference
from specdec.runtime.batch import Batch
from specdec.runtime.engine import Engine
from specdec.records import Request, SamplingParams
from tests.core.conftest import generate

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
from inputs import DEFAULT_PROMPTS, prompt_ids  # noqa: E402

CPU = torch.device("cpu")
TARGET, DRAFT = ROOT / "models" / "default" / "target", ROOT / "models" / "default" / "draft"
MAX_TOKENS, K = 24, 4


def logits_of(engine: Engine):
    """ids -> logits at every position, the whole sequence read afresh in a free slot."""
    def logits(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            batch = Batch.build([ids], [0], [engine.cache.scratch - 1], engine.cache, CPU)
            return engine.model.logits(engine.model(batch, engine.cache))[0]
    return logits


@pytest.fixture(scope="module")
def pair():
    return (Engine.load(str(TARGET), 9, 128, torch.float32, CPU),
            Engine.load(str(DRAFT), 9, 128, torch.float32, CPU))


@pytest.mark.parametrize("params", [SamplingParams(),
                                    SamplingParams(temperature=0.8, top_p=0.95, seed=7)],
                         ids=["greedy", "sampled"])
def test_the_loop_draws_what_the_reference_draws(pair, params):
    target, draft = pair
    prompts = prompt_ids(TARGET, DEFAULT_PROMPTS, 8)
    served = generate(target, draft, [Request(p, MAX_TOKENS, K, params) for p in prompts])
    accepted = 0
    for p, (tokens, stats, _) in zip(prompts, served):
        want = reference.generate(logits_of(target), logits_of(draft), p, MAX_TOKENS, K, params)
        assert tokens == want
        accepted += stats.total_accepted_draft_tokens
    assert accepted > 0   # the drafts were tested, not only the target's own tokens
