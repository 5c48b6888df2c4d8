"""OpenAI's logprobs fields, from the logprobs the orchestrator returns: every value is the
target's own, scored by the verification that committed the token (specdec/runtime/logprobs.py).

Completions (OpenAI's legacy shape): `{tokens, token_logprobs, top_logprobs, text_offset}`,
the prompt's first token null when echoed. Chat: `{content: [{token, logprob, bytes,
top_logprobs: [{token, logprob, bytes}]}]}`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec import names

# JSON has no -inf: a token that top-k or top-p left out (its probability 0 in the
# distribution sampled from) reads as this, as vLLM's OpenAI server writes it.
NO_PROBABILITY = -9999.0


@dataclass
class Scored:
    id: int
    logprob: float | None                    # None: the prompt's first token
    top: list[tuple[int, float]] = field(default_factory=list)


def _finite(v: float) -> float:
    return v if v > NO_PROBABILITY else NO_PROBABILITY


def from_arrays(ids: list[int], values, top_ids=None, top_values=None) -> list[Scored]:
    """ids [n] with their logprobs [n] and alternatives [n, top] (numpy) as a response holds
    them."""
    values = values.reshape(-1).tolist()
    if not values:
        return []
    tops = ([] if top_ids is None else
            [list(zip(i, v)) for i, v in zip(top_ids.reshape(len(values), -1).tolist(),
                                             top_values.reshape(len(values), -1).tolist())])
    return [Scored(t, _finite(v), [(i, _finite(x)) for i, x in tops[n]] if tops else [])
            for n, (t, v) in enumerate(zip(ids, values))]


def of_response(result, new_ids: list[int], prompt_ids: list[int]
                ) -> tuple[list[Scored] | None, list[Scored] | None]:
    """A response's (new tokens' scored, the prompt's scored: its first token null), None
    where it carries none."""
    def get(name):
        return result.as_numpy(name)
    out = prompt = None
    if get(names.OUTPUT_LOG_PROBS) is not None:
        out = from_arrays(new_ids, get(names.OUTPUT_LOG_PROBS), get(names.TOP_LOGPROB_IDS),
                          get(names.TOP_LOGPROB_VALUES))
    if get(names.PROMPT_LOG_PROBS) is not None:
        prompt = [Scored(prompt_ids[0], None)] + from_arrays(
            prompt_ids[1:], get(names.PROMPT_LOG_PROBS), get(names.PROMPT_TOP_LOGPROB_IDS),
            get(names.PROMPT_TOP_LOGPROB_VALUES))
    return out, prompt


class TokenText:
    """A token's own text, as OpenAI's logprobs show it: special tokens included, a byte-level
    piece of a character as the replacement character (its bytes are the piece's text's)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}

    def __call__(self, i: int) -> str:
        text = self.cache.get(i)
        if text is None:
            t = self.tokenizer
            text = self.cache[i] = t.convert_tokens_to_string([t.convert_ids_to_tokens(i)])
        return text


def completion(text_of: TokenText, scored: list[Scored], offset: int) -> tuple[dict, int]:
    """The legacy fields of these tokens, their text offsets from `offset`; and the offset
    after them."""
    out: dict = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for s in scored:
        text = text_of(s.id)
        out["tokens"].append(text)
        out["token_logprobs"].append(s.logprob)
        # The likeliest tokens, and the chosen one among them (as OpenAI's legacy API has it).
        out["top_logprobs"].append(None if s.logprob is None else
                                   {**{text_of(i): v for i, v in s.top}, text: s.logprob})
        out["text_offset"].append(offset)
        offset += len(text)
    return out, offset


def chat(text_of: TokenText, scored: list[Scored]) -> dict:
    def entry(i: int, v: float) -> dict:
        text = text_of(i)
        return {"token": text, "logprob": v, "bytes": list(text.encode())}
    return {"content": [{**entry(s.id, s.logprob), "top_logprobs": [entry(i, v) for i, v in s.top]}
                        for s in scored]}
