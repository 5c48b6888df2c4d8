"""Function calling in the OpenAI gateway, without a server: the calls read out of each family's
format, whole and streamed (specdec/openai/tools.py), the format chosen from the checkpoint, the
requests' checks, and the tools rendered by chat templates of each family's shape on the embedded
tokenizer (tests/chat_templates.py). End to end: tests/e2e/test_openai.py."""
from __future__ import annotations

import json
import random

import pytest

from specdec.openai import protocol, tools
from specdec.openai.limits import GatewaySettings, Limits
from specdec.openai.protocol import ApiError, parse_chat
from specdec.openai.tools import Call, Stream, parse
from specdec.openai.triton import SpecDecoding
from specdec.serving.settings import SettingsError
from specdec.serving.tokenizer import load_tokenizer
from specdec_client import Result
from tests.chat_templates import TARGET, TEMPLATES, tools_tokenizer

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {"name": "get_time"}}
PARIS = Call("get_weather", '{"city": "Paris"}')
ROME = Call("get_weather", '{"city": "Rome"}')
# A conversation that went through one call: the assistant's call (content null) and the
# tool's answer, then a new question.
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [{
        "id": "abcdefghi", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "abcdefghi", "content": "18 C, sunny"},
    {"role": "user", "content": "And in Rome?"}]


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """parser -> the embedded tokenizer with a template of that family's calling format
    (Mistral's marker a special token, as in Mistral's tokenizers)."""
    root = tmp_path_factory.mktemp("families")
    return {name: load_tokenizer(str(tools_tokenizer(
        root / name, template, ("[TOOL_CALLS]",) if name == "mistral" else ())))
        for name, template in TEMPLATES.items()}


def refused(call, param: str) -> ApiError:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == 400 and e.value.param == param, e.value.body()
    assert e.value.message.startswith(f"{param}: ")
    return e.value


# ---------------------------------------------------------------- the formats

@pytest.mark.parametrize("parser, text, content, calls", [
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
               '</tool_call>', None, [PARIS]),
    ("hermes", 'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": '
               '"Paris"}}</tool_call>\n<tool_call>{"name": "get_weather", "arguments": '
               '{"city": "Rome"}}</tool_call>', "Let me look.", [PARIS, ROME]),
    ("hermes", '<tool_call>{"name": "get_time"}</tool_call>', None, [Call("get_time", "{}")]),
    # a block that does not parse stays content, the others are calls
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
               '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>',
     '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>', [ROME]),
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Paris"}}', None, [PARIS]),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
                    '{"name": "get_weather", "parameters": {"city": "Rome"}}', None,
     [PARIS, ROME]),
    ("llama3_json", ' {"name": "get_weather", "arguments": {"city": "Paris"}}\n', None, [PARIS]),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                '{"name": "get_weather", "arguments": {"city": "Rome"}}]', None, [PARIS, ROME]),
    ("mistral", 'Checking. [TOOL_CALLS] [{"name": "get_weather", "arguments": "{\\"city\\": '
                '\\"Paris\\"}"}]', "Checking.", [PARIS]),
])
def test_calls_are_read_in_each_format(parser, text, content, calls):
    assert parse(parser, text) == (content, calls)


@pytest.mark.parametrize("parser, text", [
    ("hermes", "No call here, just text about <tool_call> tags."),
    ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}'),  # unclosed
    ("hermes", '<tool_call>{"arguments": {"city": "Paris"}}</tool_call>'),             # no name
    ("llama3_json", '{"name": "Bob", "age": 3}'),        # JSON, but not a call
    ("llama3_json", '{"name": "get_weather", "parameters": {"city": "Par'),           # cut off
    ("llama3_json", '{"name": "get_weather", "parameters": {}} and then some words'),
    ("llama3_json", "The weather is fine."),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
    ("mistral", "[TOOL_CALLS] not json"),
    ("mistral", '[{"name": "get_weather", "arguments": {}}]'),   # no marker: text
    ("none", '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'),
])
def test_text_that_does_not_parse_stays_content_unchanged(parser, text):
    assert parse(parser, text) == (text, [])


def streamed(parser: str, text: str, seed: int) -> tuple[str, list[Call]]:
    """The text fed to a Stream in random pieces: (the content pieces joined, the calls)."""
    rng, stream, events, at = random.Random(seed), Stream(parser), [], 0
    while at < len(text):
        step = rng.randint(1, 6)
        events += stream.feed(text[at:at + step])
        at += step
    events += stream.close()
    assert all(e for e in events if isinstance(e, str))   # no empty content pieces
    return "".join(e for e in events if isinstance(e, str)), [e for e in events
                                                              if isinstance(e, Call)]


@pytest.mark.parametrize("parser, text", [
    ("hermes", 'Let me look.\n<tool_call>{"name": "get_weather", "arguments": {"city": '
               '"Paris"}}</tool_call>\n<tool_call>{"name": "get_weather", "arguments": '
               '{"city": "Rome"}}</tool_call>\n'),
    ("hermes", '<tool_call>{"name": "x", "arguments": {"a": </tool_call> and <tool_call>'
               '{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>'),
    ("hermes", "Plain text with a < and <tool in it, and <tool_call> at the end"),
    ("llama3_json", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("llama3_json", '  {"name": "get_weather", "parameters": {"city": "Paris"}};{"name": '
                    '"get_weather", "parameters": {"city": "Rome"}}'),
    ("llama3_json", '{"name": "Bob"} is JSON, not a call'),
    ("llama3_json", "<|python_ta is not the tag"),
    ("llama3_json", "Sunny, 18 C. {\"name\": \"get_weather\"} mid-text is no call"),
    ("mistral", 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
    ("mistral", "[TOOL_CALL is not the marker, [TOOL_CALLS] broken"),
])
def test_a_streamed_message_reads_as_the_whole_one(parser, text):
    content, calls = parse(parser, text)
    for seed in range(20):
        got_content, got_calls = streamed(parser, text, seed)
        assert got_calls == calls
        if calls:
            assert got_content.strip() == (content or "")
        else:   # no call: every byte of the text, as without tools
            assert got_content == text


def test_a_stream_sends_text_before_a_call_and_each_hermes_call_at_its_closing_tag():
    stream = Stream("hermes")
    assert stream.feed("Let me ") == ["Let me "]
    assert stream.feed("look. <tool") == ["look. "]            # "<tool" may open a call
    assert stream.feed('_call>{"name": "get_weather", ') == []
    assert stream.feed('"arguments": {"city": "Paris"}}</tool_call>\n') == [PARIS]
    assert stream.close() == []                                  # whitespace after calls
    llama = Stream("llama3_json")
    assert llama.feed("  ") == [] and llama.feed("The") == ["  The"]
    assert llama.feed(" end") == [" end"]


# ---------------------------------------------------------------- the checkpoint's format

@pytest.mark.parametrize("template, vocabulary, parser", [
    ("...{{ '<tool_call>' }}...", {}, "hermes"),
    ("...{% if m.role == 'ipython' %}...", {}, "llama3_json"),
    ("...<|python_tag|>...", {}, "llama3_json"),
    ("...[TOOL_CALLS]...[AVAILABLE_TOOLS]...", {}, "mistral"),
    ("{{ m.content }}", {"[TOOL_CALLS]": 5}, "mistral"),        # named by the vocabulary
    ("{{ m.content }}", {"<tool_call>": 7, "</tool_call>": 8}, "hermes"),
    ("{{ m.content }}", {"<|im_start|>": 3}, "none"),
])
def test_the_format_is_detected_from_the_template_then_the_vocabulary(template, vocabulary,
                                                                      parser):
    assert tools.detect(template, vocabulary) == parser


def test_the_families_templates_are_detected_and_the_setting_overrides(family):
    for parser, tok in family.items():
        assert tools.choose("auto", tok) == parser and tools.takes_tools(tok)
        assert tools.choose("none", tok) == "none" and tools.choose("hermes", tok) == "hermes"
    plain = load_tokenizer(str(TARGET))   # no chat template
    assert tools.choose("auto", plain) == "none" and not tools.takes_tools(plain)


def test_the_settings_are_read_and_checked(monkeypatch):
    assert Limits.read().gateway == GatewaySettings(8, "auto")
    monkeypatch.setenv("SPECDEC_MAX_N", "3")
    monkeypatch.setenv("SPECDEC_TOOL_PARSER", "mistral")
    assert Limits.read().gateway == GatewaySettings(3, "mistral")
    monkeypatch.setenv("SPECDEC_TOOL_PARSER", "qwen")
    with pytest.raises(SettingsError, match="SPECDEC_TOOL_PARSER"):
        Limits.read()
    monkeypatch.setenv("SPECDEC_TOOL_PARSER", "auto")
    monkeypatch.setenv("SPECDEC_MAX_N", "0")
    with pytest.raises(SettingsError, match="SPECDEC_MAX_N"):
        Limits.read()


def test_a_special_marker_is_decoded_as_text_for_its_parser(family):
    """Mistral's [TOOL_CALLS] is a special token: the decode of a request with tools keeps it,
    where every other request's text leaves it out, as the ensemble's does."""
    tok = family["mistral"]
    keep = tools.kept_ids(tok, "mistral")
    marker = tok.convert_tokens_to_ids("[TOOL_CALLS]")
    assert keep == {marker} and tools.kept_ids(family["hermes"], "hermes") == frozenset()
    gateway = SpecDecoding("127.0.0.1:1", tok)
    text = 'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'
    ids = tok(text)["input_ids"]
    assert marker in ids
    assert gateway._decode(ids, keep) == text
    assert gateway._decode(ids) == tok.decode(ids, skip_special_tokens=True)
    assert "[TOOL_CALLS]" not in gateway._decode(ids)
    assert parse("mistral", gateway._decode(ids, keep)) == ("Sure.", [ROME])


# ---------------------------------------------------------------- requests

def tools_chat(tok, parser: str = "hermes", **body) -> protocol.Generation:
    return parse_chat({"model": "m", "messages": HISTORY, **body}, "m", tok,
                      gateway=GatewaySettings(tool_parser=parser))


@pytest.mark.parametrize("parser", sorted(TEMPLATES))
def test_each_familys_template_renders_the_tools_and_the_calls_history(family, parser):
    tok = family[parser]
    gen = tools_chat(tok, parser, tools=[WEATHER, TIME])
    for tool in (WEATHER, TIME):
        assert json.dumps(tool) in gen.prompt, gen.prompt
    assert gen.tool_parser == parser
    # the assistant's call goes to the template with its arguments an object, not a string
    assert '"city": "Paris"' in gen.prompt and '\\"city\\"' not in gen.prompt
    assert "18 C, sunny" in gen.prompt and "And in Rome?" in gen.prompt
    assert gen.prompt == tok.apply_chat_template(
        protocol.messages(HISTORY), tools=[WEATHER, TIME], tokenize=False,
        add_generation_prompt=True)
    auto = tools_chat(tok, parser, tools=[WEATHER], tool_choice="auto")
    assert auto.prompt == tools_chat(tok, parser, tools=[WEATHER]).prompt
    # tool_choice none: the model is not shown the tools, and nothing is read as a call
    none = tools_chat(tok, parser, tools=[WEATHER], tool_choice="none")
    assert json.dumps(WEATHER) not in none.prompt and none.tool_parser is None
    assert none.prompt == tools_chat(tok, parser).prompt


def test_tools_need_a_template_that_takes_them(family):
    from tests.adapters.test_openai_protocol import Templated
    e = refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                                    "tools": [WEATHER]}, "m", Templated()), "tools")
    assert "does not take tools" in e.message
    # without tools (or an empty list) the same request is served
    assert parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}],
                       "tools": [], "tool_choice": "auto"}, "m", Templated()).tool_parser is None


def test_with_the_parser_off_tools_are_rendered_and_nothing_is_read(family):
    gen = tools_chat(family["hermes"], "none", tools=[WEATHER])
    assert json.dumps(WEATHER) in gen.prompt and gen.tool_parser is None


@pytest.mark.parametrize("body, param, words", [
    ({"tools": {"type": "function"}}, "tools", "a list"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools", "[0]"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools",
     "name"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools", "name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]}, "tools",
     "parameters"),
    ({"tools": [{"type": "function", "function": {"name": "f", "extra": 1}}]}, "tools",
     "function"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "twice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice", "an offered tool"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "exclude"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", "'auto'"),
])
def test_malformed_tools_and_choices_are_a_400_naming_them(family, body, param, words):
    e = refused(lambda: tools_chat(family["hermes"], **body), param)
    assert words in e.message, e.message


def test_a_forced_call_is_a_grammar_and_read_back_as_calls(family):
    """tool_choice required or a named function: the output is held to the calls' JSON schema
    (a list of {name, parameters}, or the named function's arguments), read back as calls."""
    from specdec import names
    tok, parser = family["hermes"], "hermes"
    named = tools_chat(tok, parser, tools=[WEATHER, TIME],
                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert json.dumps(WEATHER) in named.prompt        # the model is shown every tool
    # get_time has no parameters: any object
    assert json.loads(named.extra_inputs()[names.JSON_SCHEMA]) == {"type": "object"}
    assert parse(named.tool_parser, '{"zone": "UTC"}') == (
        None, [Call("get_time", '{"zone": "UTC"}')])
    required = tools_chat(tok, parser, tools=[WEATHER, TIME], tool_choice="required")
    schema = json.loads(required.extra_inputs()[names.JSON_SCHEMA])
    assert schema["type"] == "array" and schema["minItems"] == 1 and "maxItems" not in schema
    one = tools_chat(tok, parser, tools=[WEATHER], tool_choice="required",
                     parallel_tool_calls=False)
    assert json.loads(one.extra_inputs()[names.JSON_SCHEMA])["maxItems"] == 1
    assert [c["properties"]["name"] for c in schema["items"]["anyOf"]] == [
        {"const": "get_weather"}, {"const": "get_time"}]
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    assert parse(required.tool_parser, text) == (None, [Call("get_weather", '{"city": "Oslo"}')])
    cut = '[{"name": "get_weather", "param'             # max_tokens reached first
    assert parse(required.tool_parser, cut) == (cut, [])
    stream = Stream(required.tool_parser)
    assert stream.feed(text[:9]) == [] and stream.feed(text[9:]) == []
    assert stream.close() == [Call("get_weather", '{"city": "Oslo"}')]


def test_response_format_is_the_schema_the_output_is_held_to(family):
    from specdec import names
    tok = family["hermes"]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    gen = tools_chat(tok, "hermes", response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": schema, "strict": True}})
    assert json.loads(gen.extra_inputs()[names.JSON_SCHEMA]) == schema
    gen = tools_chat(tok, "hermes", response_format={"type": "json_object"})
    assert json.loads(gen.extra_inputs()[names.JSON_SCHEMA]) == {"type": "object"}
    assert names.JSON_SCHEMA not in tools_chat(tok, "hermes", response_format={
        "type": "text"}).extra_inputs()
    for bad in ({"type": "json_schema"}, {"type": "yaml"}, "json",
                {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}):
        refused(lambda: tools_chat(tok, "hermes", response_format=bad), "response_format")


@pytest.mark.parametrize("message", [
    {"role": "tool", "content": "18 C"},                                   # no tool_call_id
    {"role": "tool", "tool_call_id": 7, "content": "18 C"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "a", "type": "function",
                                                          "function": {"name": "f"}}]},
    {"role": "assistant", "content": None, "tool_calls": "f()"},
    {"role": "assistant", "content": None},                                 # null, no calls
])
def test_malformed_tool_messages_are_a_400_naming_messages(family, message):
    refused(lambda: parse_chat({"model": "m", "messages": [
        {"role": "user", "content": "hi"}, message]}, "m", family["hermes"]), "messages")


# ---------------------------------------------------------------- responses

def test_a_response_with_calls(family):
    gen = tools_chat(family["hermes"], tools=[WEATHER])
    text = ('I will check.\n<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}'
            '</tool_call>')
    body = protocol.response(gen, "chatcmpl-1", Result(text=text, num_output_tokens=30,
                                                       num_input_tokens=9, finish_reason="eos"))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "I will check."
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and len(call["id"]) > 10 and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    # without a call that parses, the text is the content and the finish reason the server's
    plain = protocol.response(gen, "chatcmpl-2", Result(text="<tool_call>{", finish_reason="length"))
    assert plain["choices"][0]["message"] == {"role": "assistant", "content": "<tool_call>{"}
    assert plain["choices"][0]["finish_reason"] == "length"
    # Mistral's templates take back only ids of 9 letters and digits
    mistral = tools_chat(family["mistral"], "mistral", tools=[WEATHER])
    body = protocol.response(mistral, "chatcmpl-3", Result(
        text='[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Rome"}}]'))
    [call] = body["choices"][0]["message"]["tool_calls"]
    assert len(call["id"]) == 9 and call["id"].isalnum()
    assert body["choices"][0]["message"]["content"] is None
    json.dumps(body)


def test_call_deltas_have_openais_streamed_shape(family):
    gen = tools_chat(family["hermes"], tools=[WEATHER], stream=True)
    first, rest = protocol.call_deltas(gen, 1, ROME)
    assert first == [{"index": 1, "id": first[0]["id"], "type": "function",
                      "function": {"name": "get_weather", "arguments": ""}}]
    assert rest == [{"index": 1, "function": {"arguments": '{"city": "Rome"}'}}]
    chunk = protocol.chunk(gen, "chatcmpl-1", 1, None, index=2, tool_calls=first)
    assert chunk["choices"][0]["index"] == 2
    assert chunk["choices"][0]["delta"] == {"tool_calls": first}
