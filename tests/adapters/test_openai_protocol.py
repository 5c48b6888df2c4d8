"""The OpenAI gateway's request checks and error mapping, without a server
(specdec/openai/protocol.py, specdec/openai/triton.py); end to end: tests/e2e/test_openai.py."""
from __future__ import annotations

import json

import pytest

from specdec.openai import protocol
from specdec.openai.limits import Limits
from specdec.openai.protocol import ApiError, parse_chat, parse_completion
from specdec.openai.triton import SpecDecoding, TritonError, api_error
from specdec.serving.requests import InvalidInput
from specdec.serving.settings import OrchestratorSettings, RequestLimits, SettingsError
from specdec.serving.tokenizer import encode_prompt, load_tokenizer
from specdec_client import GenerationParams, Result
from tests.e2e.conftest import ROOT

TARGET = ROOT / "models" / "default" / "target"
CHATML = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
          "{% if add_generation_prompt %}<|assistant|>{% endif %}")


class Templated:
    """A tokenizer stand-in: the chat template is all the gateway asks of it."""
    chat_template = CHATML

    def apply_chat_template(self, conversation, tokenize, add_generation_prompt):
        assert tokenize is False and add_generation_prompt is True
        return "".join(f"<|{m['role']}|>{m['content']}\n" for m in conversation) + "<|assistant|>"


def chat(**body):
    return parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}], **body},
                      "m", Templated())


def refused(call, param: str, status: int = 400) -> ApiError:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == status and e.value.param == param, e.value.body()
    return e.value


def test_a_chat_request_becomes_the_ensembles_parameters():
    gen = chat(max_completion_tokens=12, temperature=0.5, top_p=0.9, seed=3, stop="\n\n",
               stream=True, stream_options={"include_usage": True}, top_k=7, num_draft_tokens=2,
               proposer="ngram", user="u", metadata={"a": "b"}, n=1, frequency_penalty=0)
    assert gen.chat and gen.stream and gen.include_usage
    assert gen.max_param == "max_completion_tokens"
    assert gen.prompt == "<|user|>hi\n<|assistant|>"
    assert gen.params == GenerationParams(max_tokens=12, temperature=0.5, top_p=0.9, top_k=7,
                                          seed=3, num_draft_tokens=2, stop_words=["\n\n"],
                                          proposer="ngram")


def test_messages_roles_and_text_parts():
    gen = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "c"}]}, "m", Templated())
    assert gen.prompt == "<|system|>be brief\n<|user|>ab\n<|assistant|>c\n<|assistant|>"
    for messages in ([], "hi", [{"role": "tool", "content": "x"}],
                     [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
                     [{"role": "user"}]):
        refused(lambda: parse_chat({"model": "m", "messages": messages}, "m", Templated()),
                "messages")


@pytest.mark.parametrize("body, param", [
    ({"n": 9}, "n"), ({"n": 0}, "n"), ({"n": 1.5}, "n"),
    ({"logprobs": 1}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"tools": [{"type": "function"}]}, "tools"), ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{}]}, "functions"), ({"response_format": {"type": "json_schema"}},
                                         "response_format"),
    ({"response_format": {"type": "regex"}}, "response_format"),
    ({"frequency_penalty": 0.1}, "frequency_penalty"),
    ({"presence_penalty": 2}, "presence_penalty"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"ignore_eos": True}, "ignore_eos"),
    ({"max_tokens": 0}, "max_tokens"), ({"max_completion_tokens": "ten"}, "max_completion_tokens"),
    ({"temperature": 3}, "temperature"), ({"top_p": -0.1}, "top_p"), ({"seed": -1}, "seed"),
    ({"stop": [1, 2]}, "stop"), ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"proposer": "magic"}, "proposer"), ({"num_draft_tokens": -2}, "num_draft_tokens"),
    ({"modalities": ["audio"]}, "modalities")])
def test_each_unsupported_or_bad_field_is_a_400_naming_it(body, param):
    e = refused(lambda: chat(**body), param)
    assert e.message.startswith(f"{param}: ")
    assert e.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("fields", [protocol.CHAT_FIELDS, protocol.COMPLETION_FIELDS])
def test_the_field_lists_hold_names(fields):
    """A sentence in a field list (it once held logit_bias's refusal) makes that field an
    unknown parameter."""
    bad_names = [f for f in fields if not f.isidentifier()]
    assert not bad_names and len(set(fields)) == len(fields), bad_names


def test_an_empty_logit_bias_is_no_bias_and_any_other_is_refused_for_its_reason():
    for empty in ({}, None):
        assert chat(logit_bias=empty).params == chat().params
        assert parse_completion({"model": "m", "prompt": "p", "logit_bias": empty}, "m")
    for call in (lambda: chat(logit_bias={"7": -100}),
                 lambda: parse_completion({"model": "m", "prompt": "p",
                                           "logit_bias": {"7": 1}}, "m")):
        e = refused(call, "logit_bias")
        assert "unknown" not in e.message and "distribution" in e.message, e.message


def test_the_servers_request_limits_apply_under_the_bodys_names():
    server = OrchestratorSettings(max_tokens_limit=100, max_draft_tokens=3,
                                  draft_model_path="none")
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    ok = parse_chat({**body, "max_tokens": 100, "num_draft_tokens": 3, "proposer": "ngram"},
                    "m", Templated(), server)
    assert (ok.params.max_tokens, ok.params.num_draft_tokens) == (100, 3)
    e = refused(lambda: parse_chat({**body, "max_completion_tokens": 101}, "m", Templated(),
                                   server), "max_completion_tokens")
    assert e.message == "max_completion_tokens: 101 is outside 1..100"
    refused(lambda: parse_completion({"model": "m", "prompt": "p", "max_tokens": 101}, "m",
                                     server), "max_tokens")
    refused(lambda: parse_chat({**body, "num_draft_tokens": 4}, "m", Templated(), server),
            "num_draft_tokens")
    e = refused(lambda: parse_chat({**body, "proposer": "draft"}, "m", Templated(), server),
                "proposer")
    assert "draft model" in e.message
    # The defaults are the server's defaults: 1024 passes, 1025 does not.
    assert chat(max_tokens=1024).params.max_tokens == 1024
    refused(lambda: chat(max_tokens=1025), "max_tokens")


def test_the_gateway_reads_the_servers_settings_from_the_environment(monkeypatch):
    for name, value in (("SPECDEC_MAX_TOKENS_LIMIT", "200"), ("SPECDEC_DEFAULT_MAX_TOKENS", "20"),
                        ("SPECDEC_MAX_DRAFT_TOKENS", "5"), ("SPECDEC_MAX_INPUT_BYTES", "16"),
                        ("SPECDEC_DEFAULT_PROPOSER", "ngram")):
        monkeypatch.setenv(name, value)
    limits = Limits.read()
    assert limits.server == OrchestratorSettings.parse({})
    assert (limits.server.max_tokens_limit, limits.server.default_max_tokens,
            limits.server.max_draft_tokens, limits.server.proposer) == (200, 20, 5, "ngram")
    assert limits.request == RequestLimits.parse({}) and limits.request.max_input_bytes == 16
    gateway = SpecDecoding("127.0.0.1:1", load_tokenizer(str(TARGET)), limits=limits.request)
    with pytest.raises(InvalidInput, match="at most 16"):
        gateway.inputs("a prompt longer than sixteen bytes", GenerationParams(), False, {})
    monkeypatch.setenv("SPECDEC_DEFAULT_MAX_TOKENS", "500")   # over the limit: refused at start
    with pytest.raises(SettingsError, match="default_max_tokens"):
        Limits.read()


def test_the_model_must_be_the_served_one():
    e = refused(lambda: parse_completion({"model": "other", "prompt": "x"}, "m"), "model", 404)
    assert e.code == "model_not_found"
    refused(lambda: parse_completion({"prompt": "x"}, "m"), "model")


def test_completion_prompts():
    assert parse_completion({"model": "m", "prompt": ["one"]}, "m").prompt == "one"
    for prompt in (["a", "b"], [1, 2, 3], "", None):
        refused(lambda: parse_completion({"model": "m", "prompt": prompt}, "m"), "prompt")
    for body, param in (({"echo": 1}, "echo"), ({"suffix": "x"}, "suffix"),
                        ({"best_of": 2}, "best_of"), ({"logprobs": 21}, "logprobs"),
                        ({"logprobs": -1}, "logprobs"), ({"max_tokens": 0}, "max_tokens")):
        refused(lambda: parse_completion({"model": "m", "prompt": "p", **body}, "m"), param)


def test_logprobs_and_echo_become_the_orchestrators_logprob_inputs():
    from specdec import names
    gen = parse_completion({"model": "m", "prompt": "p", "logprobs": 3, "echo": True,
                            "max_tokens": 0}, "m")
    assert (gen.logprobs, gen.prompt_logprobs, gen.echo, gen.score_only) == (3, 3, True, True)
    assert gen.extra_inputs() == {names.TOP_LOGPROBS: 3, names.PROMPT_LOGPROBS: 3,
                                  names.MAX_TOKENS: 0}
    gen = parse_completion({"model": "m", "prompt": "p", "echo": True, "max_tokens": 0}, "m")
    assert gen.extra_inputs() == {names.PROMPT_LOGPROBS: 0, names.MAX_TOKENS: 0}
    gen = parse_completion({"model": "m", "prompt": "p", "logprobs": 0}, "m")
    assert gen.extra_inputs() == {names.TOP_LOGPROBS: 0} and not gen.echo
    assert chat(logprobs=True, top_logprobs=5).extra_inputs() == {names.TOP_LOGPROBS: 5}
    assert chat(logprobs=True).extra_inputs() == {names.TOP_LOGPROBS: 0}
    assert chat(logprobs=False).extra_inputs() == chat().extra_inputs() == {}


def test_a_tokenizer_without_a_template_refuses_chat():
    class Plain:
        chat_template = None
    refused(lambda: parse_chat({"model": "m", "messages": [{"role": "user", "content": "x"}]},
                               "m", Plain()), "messages")


@pytest.mark.parametrize("message, status, param", [
    ("in ensemble 'ensemble', UNAVAILABLE: all 16 sequence slots stayed busy for 30.0s", 503,
     None),
    ("in ensemble 'ensemble', max_tokens: 5000 is outside 1..1024", 400, "max_completion_tokens"),
    ("in ensemble 'ensemble', text_input: prompt has 2000 tokens; the context window is 1024",
     400, "messages"),
    ("in ensemble 'ensemble', stop_words: 70 words; at most 64", 400, "stop"),
    ("in ensemble 'ensemble', top_p: 0.0 is outside (0, 1]", 400, "top_p"),
    ("in ensemble 'ensemble', CUDA out of memory", 500, None),
    # as the orchestrator says them when called directly, as the gateway calls it
    ("UNAVAILABLE: all 1 sequence slots stayed busy for 1.0s; retry later", 503, None),
    ("max_tokens: 5000 is outside 1..1024", 400, "max_completion_tokens"),
    ("input_ids: token ids must be within 0..4095", 400, "messages"),
    ("CUDA out of memory", 500, None)])
def test_the_servers_errors_in_openais_words(message, status, param):
    gen = chat(max_completion_tokens=500)
    e = api_error(TritonError(message), gen)
    assert (e.status, e.param) == (status, param), e.body()
    if status == 503:
        assert e.headers == {"Retry-After": "1"}
    assert api_error(TritonError("failed to connect", "StatusCode.UNAVAILABLE"), gen).status == 503
    assert api_error(TritonError("bad shape", "StatusCode.INVALID_ARGUMENT"), gen).status == 400


def test_responses_and_chunks_have_openais_shape():
    gen = chat(stream=True, stream_options={"include_usage": True})
    result = Result(text="ok", num_output_tokens=2, num_input_tokens=5, total_draft_tokens=4,
                    total_accepted_draft_tokens=3, acceptance_rate=0.75, finish_reason="eos")
    body = protocol.response(gen, "chatcmpl-1", result)
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "ok"}
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7}
    assert body["specdec"]["acceptance_rate"] == 0.75
    first = protocol.chunk(gen, "chatcmpl-1", 1, None, first=True)
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first["usage"] is None and first["object"] == "chat.completion.chunk"
    last = protocol.usage_chunk(gen, "chatcmpl-1", 1, result)
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 7
    json.dumps([body, first, last])


def test_a_rendered_chat_template_gets_no_second_bos(tmp_path):
    """A tokenizer that adds BOS itself, given text that begins with it (a chat template
    rendered to text): the ids are apply_chat_template's, BOS once."""
    from tokenizers import Tokenizer, processors
    tok = load_tokenizer(str(TARGET))
    raw = Tokenizer.from_file(str(TARGET / "tokenizer.json"))
    raw.post_processor = processors.TemplateProcessing(
        single=f"{tok.bos_token} $A", special_tokens=[(tok.bos_token, tok.bos_token_id)])
    for f in TARGET.glob("*token*"):
        (tmp_path / f.name).write_bytes(f.read_bytes())
    raw.save(str(tmp_path / "tokenizer.json"))
    adds_bos = load_tokenizer(str(tmp_path))
    text = "def f():"
    assert adds_bos(text)["input_ids"][0] == tok.bos_token_id          # it adds BOS
    assert encode_prompt(adds_bos, text) == adds_bos(text)["input_ids"]
    rendered = tok.bos_token + text
    assert encode_prompt(adds_bos, rendered) == [tok.bos_token_id] + tok(text)["input_ids"]
    assert encode_prompt(tok, rendered) == tok(rendered)["input_ids"]   # no BOS added: as is
