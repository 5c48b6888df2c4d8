"""Logprobs are the target's own: each committed token's from the verification that scored it,
the prompt's from the prefill, equal to transformers' log-softmax of the same checkpoint, and
the same whatever drafted (greedy)."""
import pytest
import torch
import transformers

from specdec.proposers.ngram import NgramProposer
from specdec.records import Finish, Proposer, Request, SamplingParams
from tests.core.conftest import engines, generate
from tests.core.test_speculative_exact import prompts

MAX_TOKENS = 16
TOP = 5
TOL = 1e-5   # the logits are float32 (model.logits), whatever the weights


def reference(target_dir, ids: list[int], temperature: float = 0.0, top_k: int = 0):
    """transformers' log-softmax [len(ids) - 1, V]: row i scores ids[i + 1]; with a
    temperature, of the distribution sampled from."""
    model = transformers.AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64)
    logits = model(torch.tensor([ids])).logits[0, :-1].double()
    if temperature:
        logits = logits / temperature
        if top_k:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.log_softmax(logits, -1)


def _check(scored, ids: list[int], ref: torch.Tensor) -> None:
    """scored[i] is ids[i]'s, from ref's row i."""
    assert len(scored) == len(ids)
    for lp, t, row in zip(scored, ids, ref):
        assert lp.logprob == pytest.approx(row[t].item(), abs=TOL)
        top = row.topk(TOP)
        assert [i for i, _ in lp.top] == top.indices.tolist()
        assert [v for _, v in lp.top] == pytest.approx(top.values.tolist(), abs=TOL)


def _run(pair_dir, requests, **options):
    target, draft = engines(pair_dir)
    return generate(target, draft, requests, **options)


@pytest.mark.parametrize("k,proposer", [(0, Proposer.DRAFT), (4, Proposer.DRAFT),
                                        (4, Proposer.NGRAM), (8, Proposer.HYBRID)])
def test_greedy_logprobs_are_the_targets(pair_dir, k, proposer):
    ps = prompts(4)
    reqs = [Request(p, MAX_TOKENS, k, proposer=proposer, logprobs=TOP, prompt_logprobs=TOP)
            for p in ps]
    results = _run(pair_dir, reqs, ngram=NgramProposer())
    for p, (tokens, stats, chunks) in zip(ps, results):
        scored = [lp for c in chunks for lp in c.logprobs]
        ref = reference(pair_dir[0], p + tokens)
        _check(scored, tokens, ref[len(p) - 1:])
        firsts = [c.prompt_logprobs for c in chunks if c.prompt_logprobs is not None]
        assert len(firsts) == 1 and chunks[0].prompt_logprobs is firsts[0]
        _check(firsts[0], p[1:], ref[:len(p) - 1])
    if k and proposer != Proposer.NGRAM:   # verdicts of several tokens were scored
        assert sum(stats.total_accepted_draft_tokens for _, stats, _ in results) > 0


def test_sampled_logprobs_are_of_the_distribution_sampled_from(pair_dir):
    ps = prompts(3)
    params = SamplingParams(temperature=0.7, top_k=20, seed=11)
    results = _run(pair_dir, [Request(p, MAX_TOKENS, 4, params, logprobs=TOP) for p in ps])
    for p, (tokens, _, chunks) in zip(ps, results):
        scored = [lp for c in chunks for lp in c.logprobs]
        ref = reference(pair_dir[0], p + tokens, 0.7, 20)[len(p) - 1:]
        _check(scored, tokens, ref)
        # A sampled token is one the filter kept; the 20 kept are all finite, the rest -inf.
        assert all(lp.logprob > float("-inf") for lp in scored)


def test_max_tokens_zero_scores_the_prompt_alone(pair_dir):
    p = prompts(1)[0]
    (tokens, stats, chunks), = _run(pair_dir, [Request(p, 0, 4, prompt_logprobs=0)])
    assert tokens == [] and chunks[-1].finish_reason == Finish.LENGTH
    assert stats.rounds == 1
    ref = reference(pair_dir[0], p)
    assert [lp.logprob for lp in chunks[0].prompt_logprobs] == pytest.approx(
        [ref[i, t].item() for i, t in enumerate(p[1:])], abs=TOL)
    assert all(lp.top == () for lp in chunks[0].prompt_logprobs)


def test_logprobs_follow_the_shown_tokens_past_stop_and_hold(pair_dir):
    """A stop sequence is held back, then cut: the logprobs go with the tokens shown."""
    p = prompts(1)[0]
    (free, _, _), = _run(pair_dir, [Request(p, MAX_TOKENS, 0)])
    stop = tuple(free[5:7])
    (tokens, _, chunks), = _run(pair_dir, [Request(p, MAX_TOKENS, 4, stop=(stop,), logprobs=0)])
    assert tokens == free[:5] and chunks[-1].finish_reason == Finish.STOP
    assert all(len(c.logprobs) == len(c.tokens) for c in chunks)
    ref = reference(pair_dir[0], p + free)[len(p) - 1:]
    assert [lp.logprob for c in chunks for lp in c.logprobs] == pytest.approx(
        [ref[i, t].item() for i, t in enumerate(tokens)], abs=TOL)


def test_no_logprobs_unless_asked(pair_dir):
    (_, _, chunks), = _run(pair_dir, [Request(prompts(1)[0], 8, 4)])
    assert all(c.logprobs is None and c.prompt_logprobs is None for c in chunks)
