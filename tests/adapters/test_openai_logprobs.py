"""OpenAI's logprobs fields from the orchestrator's logprob outputs (specdec/openai/logprobs.py),
with the default target's real tokenizer; served end to end: tests/e2e/test_openai.py."""
import numpy as np
import pytest

from specdec import names
from specdec.openai import logprobs
from specdec.serving.tokenizer import load_tokenizer
from tests.e2e.conftest import ROOT


@pytest.fixture(scope="module")
def text_of():
    return logprobs.TokenText(load_tokenizer(str(ROOT / "models" / "default" / "target")))


class Response:
    """A tritonclient InferResult's as_numpy over given outputs."""

    def __init__(self, **outputs):
        self.outputs = outputs

    def as_numpy(self, name):
        return self.outputs.get(name)


def test_a_response_scores_its_new_tokens_and_the_prompt(text_of):
    r = Response(**{names.OUTPUT_LOG_PROBS: np.array([-0.5, -np.inf], np.float32),
                    names.TOP_LOGPROB_IDS: np.array([[5, 6], [7, 8]], np.int32),
                    names.TOP_LOGPROB_VALUES: np.array([[-0.5, -1.0], [-0.25, -np.inf]],
                                                       np.float32),
                    names.PROMPT_LOG_PROBS: np.array([-2.0], np.float32)})
    out, prompt = logprobs.of_response(r, [5, 9], [3, 4])
    assert [(s.id, s.logprob, s.top) for s in out] == [
        (5, -0.5, [(5, -0.5), (6, -1.0)]), (9, logprobs.NO_PROBABILITY,
                                            [(7, -0.25), (8, logprobs.NO_PROBABILITY)])]
    assert [(s.id, s.logprob, s.top) for s in prompt] == [(3, None, []), (4, -2.0, [])]
    assert logprobs.of_response(Response(), [5], [3]) == (None, None)
    none = Response(**{names.OUTPUT_LOG_PROBS: np.zeros(0, np.float32),   # a last response
                       names.TOP_LOGPROB_IDS: np.zeros((0, 2), np.int32),
                       names.TOP_LOGPROB_VALUES: np.zeros((0, 2), np.float32)})
    assert logprobs.of_response(none, [], [3]) == ([], None)


def test_completion_fields_follow_openais_legacy_shape(text_of):
    ids = [text_of.tokenizer.encode(w, add_special_tokens=False)[0] for w in ("def", " f")]
    scored = [logprobs.Scored(ids[0], None), logprobs.Scored(ids[1], -1.5, [(ids[0], -0.5)])]
    out, end = logprobs.completion(text_of, scored, 0)
    texts = [text_of(i) for i in ids]
    assert out["tokens"] == texts and "".join(texts).startswith("def")
    assert out["token_logprobs"] == [None, -1.5]
    # The first (prompt) token has none; then the likeliest, the chosen one with them.
    assert out["top_logprobs"] == [None, {texts[0]: -0.5, texts[1]: -1.5}]
    assert out["text_offset"] == [0, len(texts[0])] and end == len("".join(texts))
    more, _ = logprobs.completion(text_of, scored[1:], end)
    assert more["text_offset"] == [end]


def test_chat_fields_follow_openais_shape(text_of):
    i = text_of.tokenizer.encode("hello", add_special_tokens=False)[0]
    (entry,) = logprobs.chat(text_of, [logprobs.Scored(i, -0.25, [(i, -0.25)])])["content"]
    assert entry["token"] == text_of(i) and entry["logprob"] == -0.25
    assert bytes(entry["bytes"]).decode() == entry["token"]
    assert entry["top_logprobs"] == [{"token": text_of(i), "logprob": -0.25,
                                      "bytes": list(text_of(i).encode())}]
