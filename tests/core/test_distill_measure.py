"""The held-out measurement replays specdec's loop exactly; the data helpers read what users
bring (corpora, prompts for chat models)."""
import json

import pytest
import torch
from transformers import AutoTokenizer

from specdec.distill import data, measure
from specdec.records import Request
from tests.core.conftest import engines, generate
from tests.core.distill_helpers import DEFAULT_TARGET

TOKENS = 20


# Shapes this small gain nothing from a second thread, which a busy machine schedules late.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def measured(pair_dir):
    target, draft = engines(pair_dir, dtype=torch.float32)
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (3, 9, 17, 30)]
    conts = measure.continuations(target, prompts, TOKENS)
    return target, draft, prompts, conts, measure.match_runs(draft, prompts, conts, max_k=8)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_replayed_rounds_equal_the_loops(measured, k):
    """Per K, the rounds, drafted and accepted tokens predicted from one pass of proposals are
    those of loop.speculate with the same engines, as the server would count them."""
    target, draft, prompts, conts, runs = measured
    results = generate(target, draft, [Request(p, TOKENS, k) for p in prompts])
    assert [r[0] for r in results] == conts
    got = measure.acceptance(runs, max_k=8)["per_k"][k]
    stats = [r[1] for r in results]
    assert got["rounds"] == sum(s.rounds for s in stats)
    assert got["drafted"] == sum(s.total_draft_tokens for s in stats)
    accepted = sum(s.total_accepted_draft_tokens for s in stats)
    assert 0 < accepted < got["drafted"]   # the noisy draft is sometimes right, sometimes not
    assert got["a"] == round(accepted / got["drafted"], 4)


def test_acceptance_by_position_and_c_are_measured(measured):
    target, draft, prompts, conts, _ = measured
    acc = measure.measure(target, draft, prompts, conts, max_k=4, timed=True)
    by_pos = acc["acceptance_by_position"]
    assert len(by_pos) == 4 and all(0 <= a <= 1 for a in by_pos) and by_pos[0] > by_pos[-1]
    assert acc["c"] > 0 and acc["best_k"] in acc["per_k"]
    assert all(0 < r["predicted_speedup"] for r in acc["per_k"].values())


def test_corpora(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "a.py").write_text("x = 1\n")
    (corpus / "sub" / "b.jsonl").write_text('{"text": "doc one"}\n{"text": "doc two"}\n')
    (corpus / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    (corpus / ".git").mkdir()
    (corpus / ".git" / "HEAD").write_text("ref: hidden")
    assert data.read_corpus(corpus) == ["x = 1\n", "doc one", "doc two"]
    tok = AutoTokenizer.from_pretrained(DEFAULT_TARGET)
    stream = data.token_stream(tok, ["x = 1\n", "doc one"], eos=0)
    assert stream.tolist() == tok("x = 1\n")["input_ids"] + [0] + tok("doc one")["input_ids"] + [0]


def test_chat_models_get_their_template(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((DEFAULT_TARGET / name).read_bytes())
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = data.encode_prompts(tok, ["def f():"], chat=True)[0]
    assert tok.decode(ids) == "<|user|>def f():<|assistant|>"
    assert data.encode_prompts(tok, ["def f():"], chat=False)[0] == tok("def f():")["input_ids"]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert tok.decode(data.encode_prompts(tok, [chat], chat=True)[0]) == \
        "<|system|>Be brief.<|user|>Hi<|assistant|>"
