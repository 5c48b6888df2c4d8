"""Parse and validate one request's inputs, given as numpy arrays; errors name the field.

Triton checks dtypes and ranks against config.pbtxt; this checks values. Every failure is an
`InvalidInput` that the adapter returns for that request alone (HTTP 400 / INVALID_ARG).
"""
from __future__ import annotations

import math
import os

import numpy as np

from .. import names
from ..records import AUTO, MAX_TOP_LOGPROBS, Proposer, Request, SamplingParams
from .settings import OrchestratorSettings, RequestLimits


class InvalidInput(ValueError):
    pass


def _scalar(inputs: dict, name: str, default):
    value = inputs.get(name)
    if value is None:
        return default
    arr = np.asarray(value)
    if arr.size != 1:
        raise InvalidInput(f"{name}: expected one value, got shape {list(arr.shape)}")
    return arr.reshape(-1)[0].item()


def decode_text(value, name: str = names.TEXT_INPUT) -> str:
    """BYTES element -> str; refuses invalid UTF-8 rather than guessing."""
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidInput(f"{name}: not valid UTF-8 ({e.reason} at byte {e.start})") from None


def parse_text(inputs: dict) -> str:
    arr = inputs.get(names.TEXT_INPUT)
    if arr is None:
        raise InvalidInput(f"{names.TEXT_INPUT}: missing")
    arr = np.asarray(arr, dtype=object).reshape(-1)
    if arr.size != 1:
        raise InvalidInput(f"{names.TEXT_INPUT}: expected one string, got {arr.size}")
    text = decode_text(arr[0])
    if not text:
        raise InvalidInput(f"{names.TEXT_INPUT}: empty")
    return text


def parse_stop_words(inputs: dict) -> list[str]:
    """The stop words; an empty string is none (TensorRT-LLM's requests send `"stop_words": ""`
    for no stop word)."""
    arr = inputs.get(names.STOP_WORDS)
    if arr is None:
        return []
    words = [decode_text(v, names.STOP_WORDS) for v in np.asarray(arr, dtype=object).reshape(-1)]
    return [w for w in words if w]


def check_sizes(text: str, stop_words: list[str], limits: RequestLimits) -> None:
    """Refuse a request larger than the limits before any tokenizer work."""
    if len(stop_words) > limits.max_stop_words:
        raise InvalidInput(f"{names.STOP_WORDS}: {len(stop_words)} words; at most "
                           f"{limits.max_stop_words}")
    sizes = [len(w.encode()) for w in stop_words]
    if sizes and max(sizes) > limits.max_stop_word_bytes:
        raise InvalidInput(f"{names.STOP_WORDS}: a word of {max(sizes)} bytes; at most "
                           f"{limits.max_stop_word_bytes}")
    total = len(text.encode()) + sum(sizes)
    if total > limits.max_input_bytes:
        raise InvalidInput(f"{names.TEXT_INPUT}: {total} bytes with the stop words; at most "
                           f"{limits.max_input_bytes}")


def check_prompt_tokens(n: int, limits: RequestLimits) -> None:
    if limits.max_prompt_tokens and n > limits.max_prompt_tokens:
        raise InvalidInput(f"{names.TEXT_INPUT}: {n} tokens; at most {limits.max_prompt_tokens}")


def parse_request(inputs: dict, settings: OrchestratorSettings, eos: tuple[int, ...],
                  vocab_size: int) -> tuple[Request, bool]:
    """Orchestrator inputs -> (Request, stream)."""
    prompt = np.asarray(inputs[names.INPUT_IDS]).reshape(-1).astype(np.int64).tolist()
    if not prompt:
        raise InvalidInput(f"{names.TEXT_INPUT}: tokenizes to nothing")
    if min(prompt) < 0 or max(prompt) >= vocab_size:
        raise InvalidInput(f"{names.INPUT_IDS}: token ids must be within 0..{vocab_size - 1}")
    if len(prompt) >= settings.max_seq_len:
        raise InvalidInput(f"{names.TEXT_INPUT}: prompt has {len(prompt)} tokens; the context "
                           f"window is {settings.max_seq_len} (prompt + output)")
    logprobs, prompt_logprobs = _logprobs(inputs)
    max_tokens = int(_scalar(inputs, names.MAX_TOKENS, settings.default_max_tokens))
    least = 0 if prompt_logprobs is not None else 1   # 0: the prompt scored, nothing generated
    if not least <= max_tokens <= settings.max_tokens_limit:
        raise InvalidInput(f"{names.MAX_TOKENS}: {max_tokens} is outside "
                           f"{least}..{settings.max_tokens_limit}")
    temperature = float(_scalar(inputs, names.TEMPERATURE, 0.0))
    if not (math.isfinite(temperature) and temperature >= 0):
        raise InvalidInput(f"{names.TEMPERATURE}: {temperature} must be >= 0")
    top_p = float(_scalar(inputs, names.TOP_P, 1.0))
    if not 0 < top_p <= 1:
        raise InvalidInput(f"{names.TOP_P}: {top_p} is outside (0, 1]")
    top_k = int(_scalar(inputs, names.TOP_K, 0))
    if top_k < 0:
        raise InvalidInput(f"{names.TOP_K}: {top_k} must be >= 0 (0 = off)")
    k = int(_scalar(inputs, names.NUM_DRAFT_TOKENS, settings.default_num_draft_tokens))
    if not -1 <= k <= settings.max_draft_tokens:
        raise InvalidInput(f"{names.NUM_DRAFT_TOKENS}: {k} is outside "
                           f"0..{settings.max_draft_tokens} (-1 or absent: chosen per round)")
    auto = k == AUTO
    seed = _seed(inputs)
    _refuse_unimplemented(inputs)
    reproducible = seed is not None and temperature > 0
    seed = int.from_bytes(os.urandom(8), "little") if seed is None else int(seed) & (2**64 - 1)
    stream = bool(_scalar(inputs, names.STREAM, False))
    stop = _stop_sequences(inputs)
    sampling = SamplingParams(temperature, top_k, top_p, seed)
    return Request(prompt, max_tokens, settings.max_draft_tokens if auto else k, sampling, stop,
                   eos, auto, reproducible, proposer=parse_proposer(inputs, settings),
                   logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                   json_schema=_json_schema(inputs), tenant=_tenant(inputs)), stream


def _tenant(inputs: dict) -> str:
    arr = inputs.get(names.TENANT)
    if arr is None:
        return ""
    arr = np.asarray(arr, dtype=object).reshape(-1)
    if arr.size != 1:
        raise InvalidInput(f"{names.TENANT}: expected one value, got {arr.size}")
    return decode_text(arr[0], names.TENANT)


def _json_schema(inputs: dict) -> str | None:
    arr = inputs.get(names.JSON_SCHEMA)
    if arr is None:
        return None
    arr = np.asarray(arr, dtype=object).reshape(-1)
    if arr.size != 1:
        raise InvalidInput(f"{names.JSON_SCHEMA}: expected one schema, got {arr.size}")
    schema = decode_text(arr[0], names.JSON_SCHEMA)
    if not schema.strip():
        raise InvalidInput(f"{names.JSON_SCHEMA}: empty")
    return schema


def _logprobs(inputs: dict) -> tuple[int | None, int | None]:
    """(the output tokens' alternatives, the prompt's): None where not asked."""
    def top(name: str) -> int | None:
        value = _scalar(inputs, name, None)
        if value is None or int(value) == -1:
            return None
        if not 0 <= int(value) <= MAX_TOP_LOGPROBS:
            raise InvalidInput(f"{name}: {value} is outside 0..{MAX_TOP_LOGPROBS} (-1 or absent: "
                               f"none)")
        return int(value)
    logprobs = top(names.TOP_LOGPROBS)
    if logprobs is None and bool(_scalar(inputs, names.RETURN_LOG_PROBS, False)):
        logprobs = 0
    return logprobs, top(names.PROMPT_LOGPROBS)


def _seed(inputs: dict):
    """seed, or TensorRT-LLM's random_seed (the same value twice is fine, two values are not)."""
    seed = _scalar(inputs, names.SEED, None)
    random_seed = _scalar(inputs, names.RANDOM_SEED, None)
    if seed is not None and random_seed is not None and int(seed) != int(random_seed):
        raise InvalidInput(f"{names.RANDOM_SEED}: {random_seed} differs from {names.SEED} {seed}; "
                           f"send one of them")
    return random_seed if seed is None else seed


def _refuse_unimplemented(inputs: dict) -> None:
    """TensorRT-LLM-format inputs that ask for what is not implemented, each by name."""
    if not bool(_scalar(inputs, names.EXCLUDE_INPUT_IN_OUTPUT, True)):
        raise InvalidInput(f"{names.EXCLUDE_INPUT_IN_OUTPUT}: false (the prompt echoed in the "
                           f"output) is not supported; the output is the generated text alone")
    for name in (names.FREQUENCY_PENALTY, names.PRESENCE_PENALTY):
        value = float(_scalar(inputs, name, 0.0))
        if value != 0.0:
            raise InvalidInput(f"{name}: {value} is not supported (only 0): a penalty would change "
                               f"the target's distribution, which speculation must keep")
    bad = inputs.get(names.BAD_WORDS)
    if bad is not None and any(decode_text(v, names.BAD_WORDS)
                               for v in np.asarray(bad, dtype=object).reshape(-1)):
        raise InvalidInput(f"{names.BAD_WORDS}: not supported (empty only)")


def parse_proposer(inputs: dict, settings: OrchestratorSettings) -> Proposer:
    arr = inputs.get(names.PROPOSER)
    if arr is None:
        return settings.proposer
    arr = np.asarray(arr, dtype=object).reshape(-1)
    if arr.size != 1:
        raise InvalidInput(f"{names.PROPOSER}: expected one value, got {arr.size}")
    value = decode_text(arr[0], names.PROPOSER)
    if value not in tuple(Proposer):
        raise InvalidInput(f"{names.PROPOSER}: {value[:40]!r} is not one of {', '.join(Proposer)}")
    lacks = settings.missing(value)
    if lacks:
        raise InvalidInput(f"{names.PROPOSER}: {value!r} needs {lacks}; this server drafts "
                           f"with {', '.join(settings.proposers)}")
    return Proposer(value)


def _stop_sequences(inputs: dict) -> tuple[tuple[int, ...], ...]:
    ids, lengths = inputs.get(names.STOP_IDS), inputs.get(names.STOP_LENGTHS)
    if ids is None or lengths is None:
        return ()
    flat = np.asarray(ids).reshape(-1).tolist()
    out, at = [], 0
    for n in np.asarray(lengths).reshape(-1).tolist():
        if n > 0:
            out.append(tuple(flat[at:at + n]))
        at += n
    return tuple(out)
