"""OpenAI request bodies in, OpenAI responses and stream chunks out.

A body is checked field by field: what is implemented becomes the ensemble's GenerationParams,
what is not (tool_choice required, response formats, penalties, ...) is a 400 naming
the parameter, and so is a field OpenAI's API does not define. Logprobs and echo are the
orchestrator's logprob inputs (logprobs.py shapes what comes back). `n` choices are n requests to the
orchestrator, one response; tools go to the chat template, and calls are read out of the text
(tools.py). The speculative extras
(`num_draft_tokens`, `proposer`, and `top_k`) come as top-level fields, which is where the
openai SDK's `extra_body` puts them.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from specdec_client import GenerationParams, Result

from .. import names
from ..records import MAX_TOP_LOGPROBS, Finish
from ..serving.settings import OrchestratorSettings
from . import tools
from .logprobs import chat as chat_logprobs, completion as completion_logprobs
from .limits import GatewaySettings

# Fields of OpenAI's request bodies that change nothing here (identification, storage, routing).
IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls")
SAMPLING = ("temperature", "top_p", "seed", "stop", "max_tokens", "top_k", "num_draft_tokens",
            "proposer", "stream", "stream_options", "n", "frequency_penalty", "presence_penalty",
            "logit_bias")
CHAT_FIELDS = ("model", "messages", "max_completion_tokens", "logprobs", "top_logprobs",
               "tools", "tool_choice", "functions", "function_call", "response_format",
               "modalities") + SAMPLING + IGNORED
COMPLETION_FIELDS = ("model", "prompt", "echo", "suffix", "best_of", "logprobs") + SAMPLING + \
    IGNORED
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}
TOOL_CHOICES = ("none", "auto")
SEEDS = 2**64   # the seed input's range: choice i's seed is seed + i within it
# The ensemble's finish reasons in OpenAI's words.
FINISH = {Finish.LENGTH: "length", Finish.EOS: "stop", Finish.STOP: "stop",
          Finish.CANCELLED: "stop"}


class ApiError(Exception):
    """An answer in OpenAI's error format."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param,
                          "code": self.code}}


def bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"{param}: {message}", param)


@dataclass
class Generation:
    """One request, as the ensemble will see it."""
    chat: bool
    model: str
    prompt: str                  # the rendered chat template, or the completion prompt
    params: GenerationParams
    stream: bool
    include_usage: bool
    max_param: str               # the body's name for max_tokens, for errors
    n: int = 1                   # choices: n requests, choice i seeded seed + i
    tool_parser: str | None = None   # the format calls are read in; None: text only
    keep_ids: frozenset[int] = field(default_factory=frozenset)   # markers decoded as text
    # Each output token's logprob with this many alternatives (None: not asked); the prompt's
    # (completions' echo); the prompt in the text (echo); the prompt alone scored (max_tokens 0).
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    echo: bool = False
    score_only: bool = False
    json_schema: str | None = None   # the output is held to it (response_format, forced calls)
    tenant: str = ""                 # the body's `user`: whose earlier outputs suffix decoding uses

    def extra_inputs(self) -> dict[str, int | str]:
        """The orchestrator's inputs that GenerationParams does not hold."""
        out = {}
        if self.logprobs is not None:
            out[names.TOP_LOGPROBS] = self.logprobs
        if self.prompt_logprobs is not None:
            out[names.PROMPT_LOGPROBS] = self.prompt_logprobs
        if self.score_only:
            out[names.MAX_TOKENS] = 0
        if self.json_schema is not None:
            out[names.JSON_SCHEMA] = self.json_schema
        if self.tenant:
            out[names.TENANT] = self.tenant
        return out

    def choice_params(self) -> list[GenerationParams]:
        """Each choice's parameters: its own seed stream where a seed is given (without one,
        each request gets its own random seed on the server)."""
        seed = self.params.seed
        return [self.params if seed is None or i == 0 else
                replace(self.params, seed=(seed + i) % SEEDS) for i in range(self.n)]


def _number(body: dict, name: str, lo: float, hi: float | None = None) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad(name, f"expected a number, got {value!r:.40}")
    if value < lo or (hi is not None and value > hi):
        raise bad(name, f"{value} is outside {lo}..{hi}" if hi is not None else
                  f"{value} must be >= {lo}")
    return value


def _integer(body: dict, name: str, lo: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, f"expected an integer, got {value!r:.40}")
    if value < lo:
        raise bad(name, f"{value} must be >= {lo}")
    return value


def _must_be(body: dict, name: str, allowed: tuple, what: str) -> None:
    """A field that is accepted only at its do-nothing values."""
    if name in body and body[name] not in allowed:
        raise bad(name, f"{what} is not supported")


def _common(body: dict, fields: tuple[str, ...], served: str) -> None:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise bad(unknown[0], "unknown parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "required (a string)")
    if model != served:
        raise ApiError(404, f"the model '{model:.100}' does not exist; this server serves "
                            f"'{served}'", "model", "model_not_found")
    for name in ("frequency_penalty", "presence_penalty"):
        _must_be(body, name, (None, 0, 0.0), "a value other than 0 (a penalty would change "
                                             "the model's distribution)")
    _must_be(body, "logit_bias", (None, {}),
             "a logit bias (it would change the model's distribution)")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise bad("stream_options", "only with stream: true")


def _params(body: dict, max_param: str, server: OrchestratorSettings) -> GenerationParams:
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad("stop", "expected a string or a list of strings")
    proposer = body.get("proposer")
    if proposer is not None and not isinstance(proposer, str):
        raise bad("proposer", "expected a string")
    k = body.get("num_draft_tokens")
    try:
        params = GenerationParams(
            max_tokens=_integer(body, max_param, 1), temperature=_number(body, "temperature", 0, 2),
            top_p=_number(body, "top_p", 0, 1), top_k=_integer(body, "top_k", 0),
            seed=_integer(body, "seed", 0), stop_words=stop or None,
            num_draft_tokens=None if k is None else _integer(body, "num_draft_tokens", -1),
            proposer=proposer)
    except (TypeError, ValueError) as e:   # GenerationParams' own checks name the field
        name = str(e).split(" ", 1)[0]
        raise bad({"max_tokens": max_param, "stop_words": "stop"}.get(name, name), str(e))
    _within(params, max_param, server)
    return params


def _within(params: GenerationParams, max_param: str, server: OrchestratorSettings) -> None:
    """The orchestrator's own limits, in its words, under the body's names."""
    if params.max_tokens is not None and params.max_tokens > server.max_tokens_limit:
        raise bad(max_param, f"{params.max_tokens} is outside 1..{server.max_tokens_limit}")
    k = params.num_draft_tokens
    if k is not None and k > server.max_draft_tokens:
        raise bad("num_draft_tokens", f"{k} is outside 0..{server.max_draft_tokens} (-1 or "
                                      f"absent: chosen per round)")
    lacks = params.proposer and server.missing(params.proposer)
    if lacks:
        raise bad("proposer", f"{params.proposer!r} needs {lacks}; this server drafts with "
                              f"{', '.join(server.proposers)}")


def _n(body: dict, gateway: GatewaySettings) -> int:
    n = _integer(body, "n", 1) or 1
    if n > gateway.max_n:
        raise bad("n", f"{n} is outside 1..{gateway.max_n} (the server's SPECDEC_MAX_N)")
    return n


def _tools(body: dict, tokenizer) -> list[dict] | None:
    """The tools to render with: None without tools or with tool_choice none (the model is
    not shown them, as vLLM does)."""
    choice = body.get("tool_choice")
    if choice is not None and choice not in TOOL_CHOICES and choice != tools.REQUIRED and \
            not isinstance(choice, dict):
        raise bad("tool_choice", "expected 'none', 'auto', 'required' or a named function")
    raw = body.get("tools")
    if raw is None or raw == []:
        if choice == tools.REQUIRED or isinstance(choice, dict):
            raise bad("tool_choice", "needs tools")
        return None
    try:
        offered = tools.check_tools(raw)
    except ValueError as e:
        raise bad("tools", str(e)) from None
    if not tools.takes_tools(tokenizer):
        raise bad("tools", "this checkpoint's chat template does not take tools")
    return None if choice == "none" else offered


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "expected true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise bad("stream_options", "only include_usage is supported")
    return stream, bool(options.get("include_usage", False))


def parse_chat(body: dict, served: str, tokenizer,
               server: OrchestratorSettings = OrchestratorSettings(),
               gateway: GatewaySettings = GatewaySettings(tool_parser="none")) -> Generation:
    """gateway.tool_parser: resolved for this tokenizer (tools.choose), never auto."""
    _common(body, CHAT_FIELDS, served)
    asked = body.get("logprobs")
    if asked is not None and not isinstance(asked, bool):
        raise bad("logprobs", "expected true or false")
    top = _top(body, "top_logprobs")
    if top and not asked:
        raise bad("top_logprobs", "needs logprobs: true")
    _must_be(body, "functions", (None, []), "function calling")
    _must_be(body, "function_call", (None, "none"), "function calling")
    _must_be(body, "modalities", (None, ["text"]), "an output other than text")
    schema = _json_schema(body)
    max_param = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    stream, usage = _stream_flags(body)
    n = _n(body, gateway)
    offered = _tools(body, tokenizer)
    prompt = render_chat(tokenizer, messages(body.get("messages")), offered)
    parser = gateway.tool_parser if offered and gateway.tool_parser in tools.PARSERS else None
    choice = body.get("tool_choice")
    if offered and (choice == tools.REQUIRED or isinstance(choice, dict)):
        if schema is not None:
            raise bad("response_format", "a JSON response and a forced tool call exclude "
                                         "each other")
        try:   # the calls a grammar holds the output to, read back as calls
            schema, parser = tools.forced(offered, choice,
                                          body.get("parallel_tool_calls") is not False)
        except ValueError as e:
            raise bad("tool_choice", str(e)) from None
    return Generation(True, body["model"], prompt, _params(body, max_param, server), stream,
                      usage, max_param, n, parser,
                      tools.kept_ids(tokenizer, parser) if parser in tools.PARSERS else
                      frozenset(), logprobs=(top or 0) if asked else None, json_schema=schema,
                      tenant=_user(body))


def _json_schema(body: dict) -> str | None:
    """response_format as the JSON schema the output is held to (None: text)."""
    fmt = body.get("response_format")
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    spec = fmt.get("json_schema") if kind == "json_schema" else None
    if not isinstance(spec, dict) or \
            not isinstance(spec.get("name"), str) or not isinstance(spec.get("schema", {}), dict):
        raise bad("response_format", "expected {\"type\": \"text\"}, {\"type\": \"json_object\"} "
                                     "or {\"type\": \"json_schema\", \"json_schema\": {\"name\", "
                                     "\"schema\"}}")
    return json.dumps(spec.get("schema", {}))


def parse_completion(body: dict, served: str,
                     server: OrchestratorSettings = OrchestratorSettings(),
                     gateway: GatewaySettings = GatewaySettings()) -> Generation:
    _common(body, COMPLETION_FIELDS, served)
    echo = body.get("echo") or False
    if not isinstance(echo, bool):
        raise bad("echo", "expected true or false")
    _must_be(body, "suffix", (None, ""), "a suffix (insertion)")
    _must_be(body, "best_of", (None, 1), "a value other than 1")
    top = _top(body, "logprobs")
    # max_tokens 0 with echo scores the prompt alone (an evaluation harness's request).
    score_only = echo and body.get("max_tokens") == 0
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt", "expected one string (lists of prompts and token ids are not "
                            "supported)")
    if not prompt:
        raise bad("prompt", "empty")
    stream, usage = _stream_flags(body)
    params = _params({**body, "max_tokens": None} if score_only else body, "max_tokens", server)
    return Generation(False, body["model"], prompt, params, stream, usage, "max_tokens",
                      _n(body, gateway), logprobs=top,
                      prompt_logprobs=top if echo and top is not None else
                      0 if score_only else None, echo=echo, score_only=score_only,
                      tenant=_user(body))


def _user(body: dict) -> str:
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise bad("user", "expected a string")
    return user or ""


def _top(body: dict, name: str) -> int | None:
    top = _integer(body, name, 0)
    if top is not None and top > MAX_TOP_LOGPROBS:
        raise bad(name, f"{top} is outside 0..{MAX_TOP_LOGPROBS}")
    return top


def messages(raw: Any) -> list[dict[str, Any]]:
    """OpenAI messages -> [{"role", "content"}] for a chat template; text content only. A tool's
    answer keeps its tool_call_id, an assistant's calls their tool_calls (content may be null)."""
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "expected a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad("messages", f"[{i}]: role must be one of {', '.join(ROLES)}")
        extra: dict[str, Any] = {}
        if m["role"] == "tool":
            if not isinstance(m.get("tool_call_id"), str):
                raise bad("messages", f"[{i}]: a tool message needs its tool_call_id")
            extra["tool_call_id"] = m["tool_call_id"]
        if m["role"] == "assistant" and m.get("tool_calls"):
            try:
                extra["tool_calls"] = tools.check_calls(m["tool_calls"])
            except ValueError as e:
                raise bad("messages", f"[{i}].{e}") from None
            if m.get("content") is None:
                m = {**m, "content": ""}
        content = m.get("content")
        if isinstance(content, list):   # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise bad("messages", f"[{i}]: only text content parts are supported")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise bad("messages", f"[{i}]: content must be a string or text parts")
        out.append({"role": ROLES[m["role"]], "content": content, **extra})
    return out


def render_chat(tokenizer, conversation: list[dict[str, Any]],
                offered: list[dict] | None = None) -> str:
    """The target's chat template with the generation prompt, as text (the ensemble tokenizes
    it, a leading BOS not doubled: specdec/serving/tokenizer.py); with tools, the template's
    own `tools` argument."""
    if not getattr(tokenizer, "chat_template", None):
        raise bad("messages", "this model's tokenizer has no chat template; use /v1/completions "
                              "with a prompt")
    try:
        if offered:
            return tokenizer.apply_chat_template(conversation, tools=offered, tokenize=False,
                                                 add_generation_prompt=True)
        return tokenizer.apply_chat_template(conversation, tokenize=False,
                                             add_generation_prompt=True)
    except Exception as e:   # the template's own refusal, e.g. roles out of order
        raise bad("messages", f"the chat template refused them: {e}") from None


# ---------------------------------------------------------------- responses

def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex


def _each(results: Result | list[Result]) -> list[Result]:
    return [results] if isinstance(results, Result) else results


def usage(results: Result | list[Result]) -> dict:
    """The prompt once and every choice's tokens (OpenAI's count for n choices)."""
    results = _each(results)
    prompt = results[0].num_input_tokens or 0
    completion = sum(r.num_output_tokens or 0 for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


SUMMED = ("total_draft_tokens", "total_accepted_draft_tokens", "ngram_draft_tokens",
          "ngram_accepted_tokens")


def speculation(results: Result | list[Result]) -> dict:
    """The request's speculative statistics, summed over its choices, a field OpenAI clients
    ignore."""
    results = _each(results)
    out = {name: None if any(getattr(r, name) is None for r in results) else
           sum(getattr(r, name) for r in results) for name in SUMMED}
    drafted, accepted = out["total_draft_tokens"], out["total_accepted_draft_tokens"]
    out["acceptance_rate"] = results[0].acceptance_rate if len(results) == 1 else \
        None if drafted is None or accepted is None else accepted / max(drafted, 1)
    return out


def finish_reason(result: Result) -> str:
    return FINISH.get(result.finish_reason or "", "stop")


def tool_call(gen: Generation, call: tools.Call) -> dict:
    return {"id": tools.call_id(gen.tool_parser), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def call_deltas(gen: Generation, k: int, call: tools.Call) -> list[list[dict]]:
    """A streamed call in OpenAI's deltas: its index, id and name, then its arguments."""
    first = tool_call(gen, call)
    first["index"], first["function"] = k, {"name": call.name, "arguments": ""}
    return [[first], [{"index": k, "function": {"arguments": call.arguments}}]]


def message(gen: Generation, result: Result) -> tuple[dict, str]:
    """A chat choice's message and finish reason: with tools, the calls read from its text."""
    content, calls = tools.parse(gen.tool_parser, result.text) if gen.tool_parser else \
        (result.text, [])
    out: dict = {"role": "assistant", "content": content}
    if calls:
        out["tool_calls"] = [tool_call(gen, c) for c in calls]
    return out, "tool_calls" if calls else finish_reason(result)


def choice_logprobs(gen: Generation, text_of, scored: list | None,
                    prompt_scored: list | None = None, offset: int = 0) -> dict | None:
    """A choice's (or a chunk's) logprobs field: the echoed prompt's tokens first; None where
    the request asked for none."""
    if gen.logprobs is None:
        return None
    if gen.chat:
        return chat_logprobs(text_of, scored or [])
    return completion_logprobs(text_of, (prompt_scored or []) + (scored or []), offset)[0]


def response(gen: Generation, rid: str, results: Result | list[Result], text_of=None,
             scored: list[tuple[list, list | None]] | None = None) -> dict:
    """scored: each choice's (its tokens' scored, the prompt's), where the request asked."""
    choices = []
    for i, result in enumerate(_each(results)):
        lp = choice_logprobs(gen, text_of, *scored[i]) if scored else None
        if gen.chat:
            said, finish = message(gen, result)
            choices.append({"index": i, "message": said, "logprobs": lp,
                            "finish_reason": finish})
        else:
            choices.append({"index": i, "text": (gen.prompt if gen.echo else "") + result.text,
                            "logprobs": lp, "finish_reason": finish_reason(result)})
    return {"id": rid, "object": "chat.completion" if gen.chat else "text_completion",
            "created": int(time.time()), "model": gen.model, "choices": choices,
            "usage": usage(results), "specdec": speculation(results)}


def chunk(gen: Generation, rid: str, created: int, text: str | None,
          finish: str | None = None, first: bool = False, index: int = 0,
          tool_calls: list[dict] | None = None, logprobs: dict | None = None) -> dict:
    """A stream chunk of choice `index` carrying `text` or `tool_calls` (or, with `finish`, the
    end of the choice), and the logprobs of the tokens it carries."""
    if gen.chat:   # the first chunk names the role
        delta: dict = {"role": "assistant", "content": ""} if first else {}
        if text:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice: dict = {"index": index, "delta": delta, "logprobs": logprobs,
                        "finish_reason": finish}
    else:
        choice = {"index": index, "text": text or "", "logprobs": logprobs,
                  "finish_reason": finish}
    out = {"id": rid, "object": "chat.completion.chunk" if gen.chat else "text_completion",
           "created": created, "model": gen.model, "choices": [choice]}
    if gen.include_usage:
        out["usage"] = None
    return out


def usage_chunk(gen: Generation, rid: str, created: int,
                results: Result | list[Result]) -> dict:
    """stream_options.include_usage: a last chunk with no choices and the usage."""
    return {"id": rid, "object": "chat.completion.chunk" if gen.chat else "text_completion",
            "created": created, "model": gen.model, "choices": [], "usage": usage(results),
            "specdec": speculation(results)}
