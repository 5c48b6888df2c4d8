"""Function calling: the tools a request offers, checked; the format the served checkpoint calls
them in; and the calls read back out of its text, whole or as it streams.

Nothing here changes what the model generates: the tools reach the model through the checkpoint's
own chat template (its `tools` argument), and a call is text in the checkpoint's own format, read
after the fact. Text that looks like a call but does not parse stays content. The formats:

- hermes (Qwen2.5, Qwen3, Hermes): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  any number of them, text around them;
- llama3_json (Llama 3.1, 3.2): the whole message is `{"name": ..., "parameters": {...}}`,
  optionally after `<|python_tag|>`, several separated by `;`;
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, text before it.

Pure Python: no torch, no tokenizer library (a tokenizer is only asked what it already has).
"""
from __future__ import annotations

import functools
import json
import re
import secrets
import string
from dataclasses import dataclass
from typing import Any

PARSERS = ("hermes", "llama3_json", "mistral")
SETTINGS = ("auto",) + PARSERS + ("none",)   # $SPECDEC_TOOL_PARSER

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS = "[TOOL_CALLS]"
# The text a call is written with, per format. Where the tokenizer marks one of them special,
# a request with tools decodes it as text all the same (kept_ids): the parser needs it.
MARKERS = {"hermes": (HERMES_OPEN, HERMES_CLOSE), "llama3_json": (PYTHON_TAG,),
           "mistral": (TOOL_CALLS,)}
# What in a chat template (or failing that, the vocabulary) names each format; the first
# match wins.
SIGNS = (("mistral", (TOOL_CALLS,)), ("hermes", (HERMES_OPEN,)),
         ("llama3_json", (PYTHON_TAG, "ipython")))

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")   # OpenAI's rule for function names
TOOL_KEYS = {"type", "function"}
FUNCTION_KEYS = {"name", "description", "parameters", "strict"}
LLAMA3_KEYS = {"type", "name", "parameters", "arguments"}
_HERMES = re.compile(re.escape(HERMES_OPEN) + r"(.*?)" + re.escape(HERMES_CLOSE), re.S)
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str   # a JSON text, as OpenAI's responses carry it


# ---------------------------------------------------------------- requests

def check_tools(raw: Any) -> list[dict]:
    """A request's `tools`, OpenAI's shape; ValueError naming the entry."""
    if not isinstance(raw, list):
        raise ValueError("expected a list of {\"type\": \"function\", \"function\": {...}}")
    names = set()
    for i, tool in enumerate(raw):
        if not isinstance(tool, dict) or tool.get("type") != "function" or set(tool) - TOOL_KEYS:
            raise ValueError(f"[{i}]: expected {{\"type\": \"function\", \"function\": {{...}}}}")
        fn = tool.get("function")
        if not isinstance(fn, dict) or set(fn) - FUNCTION_KEYS:
            raise ValueError(f"[{i}].function: expected an object with name, description, "
                             f"parameters")
        name = fn.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ValueError(f"[{i}].function.name: expected 1 to 64 letters, digits, _ or -")
        if name in names:
            raise ValueError(f"[{i}].function.name: {name!r} is offered twice")
        names.add(name)
        if not isinstance(fn.get("description", ""), str):
            raise ValueError(f"[{i}].function.description: expected a string")
        if not isinstance(fn.get("parameters", {}), dict):
            raise ValueError(f"[{i}].function.parameters: expected a JSON schema object")
    return raw


# ---------------------------------------------------------------- calls a grammar forces

REQUIRED, NAMED = "required", "named:"   # readers of forced calls (not a family's format)


def forced(offered: list[dict], choice: Any, parallel: bool = True) -> tuple[str, str]:
    """tool_choice `required` or a named function: (the JSON schema the output is held to, its
    reader). As vLLM serves them: the named function's arguments alone, or a list of calls
    [{"name", "parameters"}], one at least (one alone without `parallel`); not the family's own
    format. ValueError naming what is wrong."""
    params = {t["function"]["name"]: t["function"].get("parameters") or {"type": "object"}
              for t in offered}
    if choice == REQUIRED:
        calls = [{"type": "object", "properties": {"name": {"const": name}, "parameters": schema},
                  "required": ["name", "parameters"], "additionalProperties": False}
                 for name, schema in params.items()]
        most = {} if parallel else {"maxItems": 1}
        return json.dumps({"type": "array", "minItems": 1, **most, "items": {"anyOf": calls}}), \
            REQUIRED
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) and \
        choice.get("type") == "function" and isinstance(choice.get("function"), dict) else None
    if name not in params:
        raise ValueError("expected 'none', 'auto', 'required' or {\"type\": \"function\", "
                         "\"function\": {\"name\": ...}} naming an offered tool")
    return json.dumps(params[name]), NAMED + name


def _forced(parser: str, text: str) -> tuple[str | None, list[Call]]:
    try:
        value = json.loads(text)
    except ValueError:     # cut short by max_tokens: the text as content
        return text, []
    if parser == REQUIRED:
        return None, [Call(c["name"], json.dumps(c["parameters"])) for c in value]
    return None, [Call(parser.removeprefix(NAMED), json.dumps(value))]


def is_forced(parser: str | None) -> bool:
    return parser is not None and (parser == REQUIRED or parser.startswith(NAMED))


def check_calls(raw: Any) -> list[dict]:
    """An assistant message's `tool_calls` as a chat template takes them: arguments an object
    where they are one (the templates write them with `tojson`), as vLLM passes them."""
    if not isinstance(raw, list):
        raise ValueError("tool_calls: expected a list")
    out = []
    for i, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(call, dict) and call.get("type", "function") == "function"
                and isinstance(call.get("id"), str) and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and isinstance(fn.get("arguments"), str)):
            raise ValueError(f"tool_calls[{i}]: expected {{\"id\", \"type\": \"function\", "
                             f"\"function\": {{\"name\", \"arguments\"}}}}")
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            arguments = fn["arguments"]
        out.append({"id": call["id"], "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def template_text(tokenizer, tools: list | None = None) -> str:
    """The chat template a render with `tools` uses (a tokenizer may hold several by name)."""
    get = getattr(tokenizer, "get_chat_template", None)
    if get is not None:
        try:
            return get(tools=tools)
        except ValueError:
            return ""
    template = getattr(tokenizer, "chat_template", None)
    return template if isinstance(template, str) else ""


def takes_tools(tokenizer) -> bool:
    return re.search(r"\btools\b", template_text(tokenizer, [])) is not None


# ---------------------------------------------------------------- the checkpoint's format

def detect(template: str, vocabulary: set[str] | dict) -> str:
    """The format a checkpoint calls tools in: named by its chat template, else by its
    vocabulary's tokens; "none" when neither names one."""
    for parser, signs in SIGNS:
        if any(sign in template for sign in signs):
            return parser
    for parser, signs in SIGNS:
        if signs[0] in vocabulary:
            return parser
    return "none"


def choose(setting: str, tokenizer) -> str:
    """$SPECDEC_TOOL_PARSER, with auto resolved for this tokenizer."""
    if setting != "auto":
        return setting
    template = getattr(tokenizer, "chat_template", None)
    text = "\n".join(template.values()) if isinstance(template, dict) else template or ""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    return detect(text, added)


@functools.lru_cache(maxsize=8)
def kept_ids(tokenizer, parser: str) -> frozenset[int]:
    """The format's marker tokens that the decode would leave out as special: a request with
    tools decodes them as text (Mistral's `[TOOL_CALLS]` is one)."""
    vocab = getattr(tokenizer, "get_added_vocab", dict)()
    kept = set()
    for marker in MARKERS.get(parser, ()):
        i = vocab.get(marker)
        if i is not None and tokenizer.decode([i], skip_special_tokens=True) == "":
            kept.add(i)
    return frozenset(kept)


def call_id(parser: str | None) -> str:
    """A call's id. Mistral's templates refuse any id but 9 letters and digits when the client
    sends the call back, so those get that shape."""
    if parser == "mistral":
        return "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(9))
    return "call_" + secrets.token_hex(12)


# ---------------------------------------------------------------- reading calls

def _call(obj: Any, arguments_key: str) -> Call | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get(arguments_key, {})
    if isinstance(arguments, str):   # some models write the arguments as a JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return Call(obj["name"], json.dumps(arguments, ensure_ascii=False))


def _json_values(text: str, pos: int, separators: str) -> list | None:
    """The JSON values from `pos` to the end, `separators` (and whitespace) between them;
    None where anything else is there."""
    values = []
    while True:
        while pos < len(text) and (text[pos].isspace() or text[pos] in separators):
            pos += 1
        if pos == len(text):
            return values
        try:
            value, pos = _DECODER.raw_decode(text, pos)
        except ValueError:
            return None
        values.append(value)


def _hermes(text: str) -> tuple[str | None, list[Call]]:
    calls, outside, last = [], [], 0
    for m in _HERMES.finditer(text):
        try:
            call = _call(json.loads(m.group(1)), "arguments")
        except ValueError:
            call = None
        if call is not None:   # a block that does not parse stays in the content
            outside.append(text[last:m.start()])
            calls.append(call)
            last = m.end()
    if not calls:
        return text, []
    outside.append(text[last:])
    return "".join(outside).strip() or None, calls


def _llama3_json(text: str) -> tuple[str | None, list[Call]]:
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):]
    values = _json_values(body, 0, ";")
    # The whole message is the call, so JSON that is not one (an answer in JSON) must not be
    # read as one: a call has its arguments and nothing else beside its name.
    calls = [_call(v, "parameters" if "parameters" in v else "arguments")
             for v in values or [] if isinstance(v, dict) and set(v) <= LLAMA3_KEYS
             and set(v) & {"parameters", "arguments"}]
    if not calls or None in calls or len(calls) != len(values):
        return text, []
    return None, calls


def _mistral(text: str) -> tuple[str | None, list[Call]]:
    start = text.find(TOOL_CALLS)
    if start < 0:
        return text, []
    values = _json_values(text.replace(TOOL_CALLS, " " * len(TOOL_CALLS)), start, "")
    items = [item for v in values or [] for item in (v if isinstance(v, list) else [v])]
    calls = [_call(item, "arguments") for item in items]
    if not calls or None in calls:
        return text, []
    return text[:start].strip() or None, calls


READERS = {"hermes": _hermes, "llama3_json": _llama3_json, "mistral": _mistral}


def parse(parser: str, text: str) -> tuple[str | None, list[Call]]:
    """(content, calls) of a whole message: the text unchanged where it holds no call that
    parses; with calls, the text outside them (None if blank)."""
    if is_forced(parser):
        return _forced(parser, text)
    reader = READERS.get(parser)
    return reader(text) if reader is not None else (text, [])


def _partial(text: str, marker: str) -> int:
    """How long a tail of `text` is that begins `marker` (to hold back until it is known)."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class Stream:
    """One choice's text as it streams, in pieces of content and whole calls: text is content
    until a call's opening (hermes `<tool_call>`, mistral `[TOOL_CALLS]`, llama3_json a message
    that begins with `{` or `<|python_tag|>`), held from there until it can be read (hermes:
    each call at its closing tag; the others: at the end), and content again if it is no call."""

    def __init__(self, parser: str):
        self.parser = parser
        self.held = ""
        self.in_call = False
        self.begun = False   # llama3_json: past the message's first non-space character
        self.calls = 0

    def feed(self, text: str) -> list[str | Call]:
        self.held += text
        out: list[str | Call] = []
        while True:
            if not self.in_call:
                start, keep = self._opening()
                if start is None:
                    sent = self.held[:len(self.held) - keep]
                    if self.calls:   # whitespace after a call waits for text (or is dropped)
                        sent = sent.rstrip()
                    self._content(out, sent)
                    self.held = self.held[len(sent):]
                    return out
                if not self.calls or self.held[:start].strip():
                    self._content(out, self.held[:start])
                self.held, self.in_call = self.held[start:], True
            end = self.held.find(HERMES_CLOSE) if self.parser == "hermes" else -1
            if end < 0:
                return out
            end += len(HERMES_CLOSE)
            block, self.held, self.in_call = self.held[:end], self.held[end:], False
            self._read(out, block)

    def close(self) -> list[str | Call]:
        out: list[str | Call] = []
        if self.in_call:
            self._read(out, self.held)
        elif not self.calls or self.held.strip():
            self._content(out, self.held)
        self.held, self.in_call = "", False
        return out

    def _opening(self) -> tuple[int | None, int]:
        """(where a call opens in the held text, or None; how much of its tail to hold)."""
        if is_forced(self.parser):   # the whole message is calls
            return 0, 0
        if self.parser == "llama3_json":
            if self.begun:
                return None, 0
            body = self.held.lstrip()
            if body.startswith(("{", PYTHON_TAG)):
                return 0, 0
            if not body or PYTHON_TAG.startswith(body):
                return None, len(self.held)
            self.begun = True
            return None, 0
        marker = MARKERS[self.parser][0]
        start = self.held.find(marker)
        return (start, 0) if start >= 0 else (None, _partial(self.held, marker))

    def _read(self, out: list, text: str) -> None:
        content, calls = parse(self.parser, text)
        self._content(out, (content or "") if calls else text)
        out.extend(calls)
        self.calls += len(calls)

    @staticmethod
    def _content(out: list, text: str) -> None:
        if text:
            out.append(text)
