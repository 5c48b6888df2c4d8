"""`specdec openai` with the official openai package as the client, on a real tritonserver of its
own (one sequence slot and a one-second queue, so a full server is easy to make).

Three gateways: one whose tokenizer is the default target's with a ChatML chat template added
(the weights and the vocabulary unchanged), one with a Hermes-style template that takes tools
(tests/chat_templates.py), one on the default tokenizer, which has no template.
"""
from __future__ import annotations

import json
import socket
import threading
import urllib.request

import pytest

openai = pytest.importorskip("openai")

from specdec.serving.tokenizer import load_tokenizer  # noqa: E402
from specdec_client import GenerationParams, generate, generate_stream  # noqa: E402
from tests.chat_templates import HERMES, tools_tokenizer  # noqa: E402
from tests.e2e.conftest import (ROOT, _free_port, heldout_prompts, launch,  # noqa: E402
                                start_gateway, templated_tokenizer, wait_for)

TARGET = ROOT / "models" / "default" / "target"
PROMPT = heldout_prompts(3)[2]
CHAT = [{"role": "system", "content": "You write Python."},
        {"role": "user", "content": "def parse_header(line):"}]


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    yield from launch(tmp_path_factory, {"SPECDEC_MAX_SEQUENCES": "1",
                                         "SPECDEC_QUEUE_TIMEOUT_S": "1"})


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    return templated_tokenizer(tmp_path_factory)


@pytest.fixture(scope="module")
def gateway(triton, templated, tmp_path_factory):
    proc, url = start_gateway(triton.grpc, templated, tmp_path_factory)
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def plain_gateway(triton, tmp_path_factory):
    proc, url = start_gateway(triton.grpc, TARGET, tmp_path_factory)
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def chat_prompt(templated) -> tuple[str, int]:
    """The template applied as the gateway applies it: (text, token count)."""
    tok = load_tokenizer(str(templated))
    text = tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    ids = tok.apply_chat_template(CHAT, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    return text, len(ids)


def greedy(max_tokens: int, **kw) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, temperature=0.0, **kw)


def test_models_lists_the_served_name(client):
    assert [m.id for m in client.models.list().data] == ["specdec-chat"]


def test_chat_equals_the_ensembles_greedy_output_for_the_templated_prompt(client, triton,
                                                                         chat_prompt):
    text, prompt_tokens = chat_prompt
    ours = generate(triton.http, text, greedy(24))
    r = client.chat.completions.create(model="specdec-chat", messages=CHAT, max_tokens=24,
                                       temperature=0)
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content == ours.text
    assert r.choices[0].finish_reason == ("length" if ours.finish_reason == "length" else "stop")
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.completion_tokens == ours.num_output_tokens
    assert r.usage.total_tokens == prompt_tokens + ours.num_output_tokens
    assert r.model_extra["specdec"]["total_draft_tokens"] >= 0


def test_chat_stream_with_usage(client, triton, chat_prompt):
    text, prompt_tokens = chat_prompt
    ours = generate(triton.http, text, greedy(24))
    chunks = list(client.chat.completions.create(
        model="specdec-chat", messages=CHAT, max_completion_tokens=24, temperature=0,
        stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1 and "".join(pieces) == ours.text
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("length", "stop") and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens == prompt_tokens
    assert chunks[-1].usage.completion_tokens == ours.num_output_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_streamed_and_not(client, triton):
    ours = generate(triton.http, PROMPT, greedy(20))
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=20,
                                  temperature=0)
    assert r.choices[0].text == ours.text
    assert r.usage.completion_tokens == ours.num_output_tokens
    tok = load_tokenizer(str(TARGET))
    assert r.usage.prompt_tokens == len(tok(PROMPT)["input_ids"])
    chunks = list(client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=20,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == ours.text


def test_stop_seed_and_the_speculative_extras(client, triton):
    first = generate(triton.http, PROMPT, greedy(16)).text
    stop = first.strip().split()[1]
    ours = generate(triton.http, PROMPT, greedy(16, stop_words=[stop]))
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=16,
                                  temperature=0, stop=stop)
    assert r.choices[0].text == ours.text and r.choices[0].finish_reason == "stop"
    sampled = generate(triton.http, PROMPT, GenerationParams(max_tokens=16, temperature=0.9,
                                                             top_p=0.95, seed=5))
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=16,
                                  temperature=0.9, top_p=0.95, seed=5)
    assert r.choices[0].text == sampled.text
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=16,
                                  temperature=0, extra_body={"num_draft_tokens": 0})
    assert r.model_extra["specdec"]["total_draft_tokens"] == 0
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=16,
                                  temperature=0, extra_body={"proposer": "ngram",
                                                             "num_draft_tokens": 4})
    stats = r.model_extra["specdec"]
    assert stats["ngram_draft_tokens"] == stats["total_draft_tokens"]
    assert r.choices[0].text == first


@pytest.mark.parametrize("kwargs, param", [
    ({"n": 9}, "n"), ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"response_format": {"type": "regex"}}, "response_format"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -1.0}, "presence_penalty"),
    ({"extra_body": {"ignore_eos": True}}, "ignore_eos"),
    ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"max_tokens": 100000}, "max_tokens"),                 # past max_tokens_limit
    ({"max_completion_tokens": 100000}, "max_completion_tokens"),
    ({"top_p": 0.0}, "top_p"),
    ({"extra_body": {"num_draft_tokens": 99}}, "num_draft_tokens"),
    ({"extra_body": {"proposer": "magic"}}, "proposer")])
def test_what_is_not_implemented_or_out_of_range_is_a_400_naming_the_parameter(client, kwargs,
                                                                              param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="specdec-chat", messages=CHAT, **kwargs)
    assert e.value.status_code == 400 and e.value.body["param"] == param, e.value.body
    assert e.value.body["message"].startswith(f"{param}: ")


def target_logprobs(ids: list[int]):
    """transformers' log-softmax of the default target (float32, as served) [len(ids) - 1, V]:
    row i scores ids[i + 1]."""
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(str(TARGET), dtype=torch.float32)
    with torch.no_grad():
        return torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].double(), -1)


LOGPROB_TOL = 1e-4   # float32: our kernels' rounding against transformers'


def test_echo_scores_the_prompt_as_evaluation_harnesses_ask(client):
    """max_tokens 0, echo, logprobs: the prompt's tokens and the target's logprobs of each,
    the first null (OpenAI's legacy completions)."""
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=0, echo=True,
                                  logprobs=2, temperature=0)
    (choice,) = r.choices
    tok = load_tokenizer(str(TARGET))
    ids = tok(PROMPT)["input_ids"]
    ref = target_logprobs(ids)
    lp = choice.logprobs
    assert choice.text == PROMPT and r.usage.completion_tokens == 0
    assert len(lp.tokens) == len(ids) and lp.token_logprobs[0] is None
    assert lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == pytest.approx(
        [ref[i, t].item() for i, t in enumerate(ids[1:])], abs=LOGPROB_TOL)
    for row, top in zip(ref, lp.top_logprobs[1:]):
        best = row.topk(2)
        assert [v for v in top.values()][:2] == pytest.approx(best.values.tolist(),
                                                              abs=LOGPROB_TOL)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_greedy_logprobs_are_the_targets_with_speculation_on_and_off(client, triton):
    """Each generated token's logprob and alternatives, drafted by any proposer or none:
    the same tokens, the same values, the target's own."""
    tok = load_tokenizer(str(TARGET))
    seen = []
    for extra in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4, "proposer": "draft"},
                  {"num_draft_tokens": 4, "proposer": "ngram"}, {}):
        r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=16,
                                      temperature=0, logprobs=3, echo=True, extra_body=extra)
        lp = r.choices[0].logprobs
        seen.append((r.choices[0].text, lp.tokens, lp.token_logprobs,
                     [list(t) for t in lp.top_logprobs[1:]]))
        if extra:
            stats = r.model_extra["specdec"]
            assert (stats["total_draft_tokens"] > 0) == bool(extra["num_draft_tokens"])
    assert all(s[0] == seen[0][0] and s[1] == seen[0][1] and s[3] == seen[0][3] for s in seen)
    for s in seen[1:]:
        assert s[2][1:] == pytest.approx(seen[0][2][1:], abs=LOGPROB_TOL)
    text, tokens, values, _ = seen[0]
    ids = tok(PROMPT)["input_ids"]
    generated = generate(triton.http, PROMPT, greedy(16)).text
    assert text == PROMPT + generated
    ref = target_logprobs(tok(PROMPT + generated)["input_ids"])
    n = len(ids)
    assert len(tokens) == n + r.usage.completion_tokens
    # The generated tokens' values, against transformers over prompt and output.
    out_ids = tok(PROMPT + generated)["input_ids"][n:]
    assert len(out_ids) == r.usage.completion_tokens   # the text retokenizes to its ids
    assert values[n:] == pytest.approx([ref[n - 1 + i, t].item()
                                        for i, t in enumerate(out_ids)], abs=LOGPROB_TOL)


def test_chat_logprobs_streamed_and_not(client):
    kw = dict(model="specdec-chat", messages=CHAT, max_tokens=12, temperature=0,
              logprobs=True, top_logprobs=2)
    r = client.chat.completions.create(**kw)
    whole = r.choices[0].logprobs.content
    assert len(whole) == r.usage.completion_tokens
    assert "".join(e.token for e in whole) == r.choices[0].message.content
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6
               for e in whole)
    streamed = [e for c in client.chat.completions.create(stream=True, **kw)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in whole]
    plain = client.chat.completions.create(**{**kw, "logprobs": False, "top_logprobs": None})
    assert plain.choices[0].logprobs is None


def test_suffix_decoding_drafts_from_an_earlier_answer(client):
    """The second time a prompt comes, suffix decoding proposes the first answer, which the
    target accepts; the output is the target's either way."""
    kw = dict(model="specdec-chat", prompt=heldout_prompts(6)[5], max_tokens=24, temperature=0)
    plain = client.completions.create(**kw, extra_body={"num_draft_tokens": 0})
    extra = {"proposer": "suffix", "num_draft_tokens": 6}
    again = [client.completions.create(**kw, extra_body=extra) for _ in range(2)]
    assert [r.choices[0].text for r in again] == [plain.choices[0].text] * 2
    stats = again[1].model_extra["specdec"]
    assert stats["total_accepted_draft_tokens"] >= 12, stats   # half the answer, drafted


def test_an_empty_logit_bias_changes_nothing(client, triton):
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=8,
                                  temperature=0, logit_bias={})
    assert r.choices[0].text == generate(triton.http, PROMPT, greedy(8)).text


def test_n_sampled_choices_are_the_ensembles_with_seeds_seed_plus_i(client, triton):
    """n=3: three requests, choice i seeded 5 + i; the server's one slot takes them in turn
    (short ones, well within its queue timeout), each as it would be alone."""
    alone = [generate(triton.http, PROMPT, GenerationParams(max_tokens=8, temperature=0.8,
                                                            seed=5 + i)) for i in range(3)]
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=8,
                                  temperature=0.8, seed=5, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert [c.text for c in r.choices] == [a.text for a in alone]
    assert r.usage.prompt_tokens == len(load_tokenizer(str(TARGET))(PROMPT)["input_ids"])
    assert r.usage.completion_tokens == sum(a.num_output_tokens for a in alone)
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.model_extra["specdec"]["total_draft_tokens"] == sum(a.total_draft_tokens
                                                                for a in alone)
    chunks = list(client.chat.completions.create(
        model="specdec-chat", messages=CHAT, max_tokens=8, temperature=0.8, seed=5, n=3,
        stream=True, stream_options={"include_usage": True}))
    texts = ["".join(c.choices[0].delta.content or "" for c in chunks
                     if c.choices and c.choices[0].index == i) for i in range(3)]
    finishes = [c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason]
    assert sorted(finishes) == [0, 1, 2]
    singles = [client.chat.completions.create(model="specdec-chat", messages=CHAT, max_tokens=8,
                                              temperature=0.8, seed=5 + i) for i in range(3)]
    assert texts == [s.choices[0].message.content for s in singles]
    assert chunks[-1].usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert chunks[-1].usage.prompt_tokens == singles[0].usage.prompt_tokens


def test_n_greedy_choices_are_identical(client, triton, chat_prompt):
    text, prompt_tokens = chat_prompt
    ours = generate(triton.http, text, greedy(12))
    r = client.chat.completions.create(model="specdec-chat", messages=CHAT, max_tokens=12,
                                       temperature=0, n=2)
    assert [c.message.content for c in r.choices] == [ours.text, ours.text]
    assert [c.index for c in r.choices] == [0, 1]
    assert r.usage.prompt_tokens == prompt_tokens
    assert r.usage.completion_tokens == 2 * ours.num_output_tokens


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def tools_client(triton, tmp_path_factory):
    """A gateway whose template takes tools, in Hermes' format (the parser chosen: hermes)."""
    tok = tools_tokenizer(tmp_path_factory.mktemp("tools") / "specdec-tools", HERMES)
    proc, url = start_gateway(triton.grpc, tok, tmp_path_factory)
    yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0), tok
    proc.terminate()
    proc.wait(30)


def rendered(tok, messages, tools=None) -> tuple[str, int]:
    tokenizer = load_tokenizer(str(tok))
    text = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                         add_generation_prompt=True)
    return text, len(tokenizer(text)["input_ids"])


def test_a_chat_with_tools_is_answered_streamed_and_not(tools_client, triton):
    """The random weights rarely write a call: the request round-trips, the tools in the
    prompt (tool_choice auto) or not (none), and the text is the ensemble's for that prompt."""
    client, tok = tools_client
    for choice, offered in (("auto", [WEATHER]), ("none", None), (None, [WEATHER])):
        text, prompt_tokens = rendered(tok, CHAT, offered)
        ours = generate(triton.http, text, greedy(16))
        kw = {"tool_choice": choice} if choice else {}
        r = client.chat.completions.create(model="specdec-tools", messages=CHAT, max_tokens=16,
                                           temperature=0, tools=[WEATHER], **kw)
        assert r.usage.prompt_tokens == prompt_tokens, choice
        message = r.choices[0].message
        if message.tool_calls:
            assert r.choices[0].finish_reason == "tool_calls"
        else:
            assert message.content == ours.text and r.choices[0].finish_reason in ("length",
                                                                                   "stop")
        chunks = list(client.chat.completions.create(
            model="specdec-tools", messages=CHAT, max_tokens=16, temperature=0, tools=[WEATHER],
            stream=True, **kw))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        if not message.tool_calls:
            assert streamed == ours.text
        assert chunks[-1].choices[0].finish_reason == r.choices[0].finish_reason
    _, without = rendered(tok, CHAT)
    assert prompt_tokens > without   # the tools' JSON is in the prompt


def test_a_conversation_with_a_call_and_its_answer(tools_client):
    client, _ = tools_client
    messages = [*CHAT, {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    r = client.chat.completions.create(model="specdec-tools", messages=messages, max_tokens=4,
                                       temperature=0, tools=[WEATHER])
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_forced_call_is_a_call_streamed_and_not(tools_client):
    """tool_choice required or a named function: a grammar holds the output to the calls'
    JSON, which comes back as tool_calls whose arguments follow the function's schema."""
    client, _ = tools_client
    city = {"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "maxLength": 12}}, "required": ["city"],
            "additionalProperties": False}}}
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        kw = dict(model="specdec-tools", messages=CHAT, max_tokens=48, temperature=0,
                  tools=[city], tool_choice=choice, parallel_tool_calls=False)
        r = client.chat.completions.create(**kw)
        assert r.choices[0].message.tool_calls, (r.choices[0].message.content, r.usage)
        (call,) = r.choices[0].message.tool_calls
        assert call.function.name == "get_weather" and r.choices[0].message.content is None
        assert set(json.loads(call.function.arguments)) == {"city"}
        chunks = list(client.chat.completions.create(stream=True, **kw))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert deltas[0].function.name == "get_weather"
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments


def test_a_json_schema_answer_validates_against_its_schema(client):
    """response_format json_schema (the SDK's parse: a pydantic model, strict): the answer
    validates, and it is the same with speculation on and off (greedy)."""
    from typing import Literal

    import pydantic

    class Forecast(pydantic.BaseModel):
        city: str = pydantic.Field(max_length=12)
        unit: Literal["celsius", "fahrenheit"]
        days: int = pydantic.Field(ge=1, le=9)

    answers = []
    for extra in ({"num_draft_tokens": 0}, {"num_draft_tokens": 4, "proposer": "draft"}, {}):
        r = client.chat.completions.parse(model="specdec-chat", messages=CHAT, max_tokens=64,
                                          temperature=0, response_format=Forecast,
                                          extra_body=extra)
        assert isinstance(r.choices[0].message.parsed, Forecast), r.choices[0].message.content
        answers.append(r.choices[0].message.content)
    assert answers == [answers[0]] * 3
    free = client.chat.completions.create(model="specdec-chat", messages=CHAT, max_tokens=16,
                                          temperature=0)
    assert not free.choices[0].message.content.startswith("{")   # the grammar made it JSON
    r = client.chat.completions.create(model="specdec-chat", messages=CHAT, max_tokens=48,
                                       temperature=0, response_format={"type": "json_object"})
    assert r.choices[0].message.content.startswith("{")


def test_an_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_a_tokenizer_without_a_template_refuses_chat_and_serves_completions(plain_gateway,
                                                                           triton):
    plain = openai.OpenAI(base_url=f"{plain_gateway}/v1", api_key="unused", max_retries=0)
    served = plain.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as e:
        plain.chat.completions.create(model=served, messages=CHAT)
    assert e.value.body["param"] == "messages" and "chat template" in e.value.body["message"]
    r = plain.completions.create(model=served, prompt=PROMPT, max_tokens=8, temperature=0)
    assert r.choices[0].text == generate(triton.http, PROMPT, greedy(8)).text


# Generations that must outlast what a test does meanwhile run target-only: about 5 s for 1000
# tokens on the 2-core CI machine, where speculation, which follows the default target's loops
# in full, may finish them in well under a second.
HOLD = 1000


def hold_the_slot(triton):
    """A long stream in the server's one sequence slot, past its first piece (over HTTP, whose
    cancel cannot touch Triton 2.51's gRPC cancellation race)."""
    stream = generate_stream(triton.http, PROMPT,
                             GenerationParams(max_tokens=HOLD, num_draft_tokens=0))
    next(iter(stream))
    return stream


def test_a_full_server_is_a_503_with_retry_after(client, triton):
    stream = hold_the_slot(triton)
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=4)
        assert e.value.status_code == 503 and e.value.response.headers["retry-after"] == "1"
        assert e.value.body["code"] == "unavailable"
        with pytest.raises(openai.APIStatusError) as e:   # streamed: decided before the body
            client.chat.completions.create(model="specdec-chat", messages=CHAT, stream=True)
        assert e.value.status_code == 503
    finally:
        stream.cancel()
    assert wait_for(lambda: triton.metric("specdec_active_sequences") == 0)


def test_a_server_that_does_not_answer_is_a_503(tmp_path_factory, templated):
    closed = _free_port()
    proc, url = start_gateway(f"127.0.0.1:{closed}", templated, tmp_path_factory)
    try:
        down = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            down.completions.create(model="specdec-chat", prompt="x", max_tokens=2)
        assert e.value.status_code == 503
        assert urllib.request.urlopen(f"{url}/health/live", timeout=5).status == 200
        with pytest.raises(urllib.error.HTTPError) as ready:
            urllib.request.urlopen(f"{url}/health", timeout=10)
        assert ready.value.code == 503
    finally:
        proc.terminate()
        proc.wait(30)


def slots_free(triton) -> bool:
    return (triton.metric("specdec_active_sequences") == 0
            and triton.metric("specdec_kv_slots_used", model="target_model") == 0)


def cancelled(triton) -> float:
    return triton.metric("specdec_requests_total", finish_reason="cancelled")


def test_a_client_that_leaves_a_stream_stops_its_generation(client, triton):
    before = cancelled(triton)
    stream = client.chat.completions.create(model="specdec-chat", messages=CHAT,
                                            max_tokens=HOLD, stream=True,
                                            extra_body={"num_draft_tokens": 0})
    next(iter(stream))
    assert triton.metric("specdec_active_sequences") == 1
    stream.close()
    # The orchestrator ends it as cancelled (a generation left to run ends as "length").
    assert wait_for(lambda: cancelled(triton) == before + 1, 30)
    assert wait_for(lambda: slots_free(triton), 30)
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=4)
    assert r.usage.completion_tokens == 4


def test_a_client_that_leaves_before_the_answer_stops_its_generation(gateway, client, triton):
    before = cancelled(triton)
    host, port = gateway.removeprefix("http://").split(":")
    body = json.dumps({"model": "specdec-chat", "prompt": PROMPT, "max_tokens": HOLD,
                       "num_draft_tokens": 0}).encode()
    with socket.create_connection((host, int(port))) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert wait_for(lambda: triton.metric("specdec_active_sequences") == 1, 30)
    assert wait_for(lambda: cancelled(triton) == before + 1, 30)
    assert wait_for(lambda: slots_free(triton), 30)
    r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=4)
    assert r.usage.completion_tokens == 4


def test_concurrent_streams_through_one_gateway(client, triton):
    """Four at once into one slot: each completes, waiting its turn within the queue timeout,
    or is refused 503; none hangs."""
    outcomes = []

    def one():
        try:
            r = client.completions.create(model="specdec-chat", prompt=PROMPT, max_tokens=4,
                                          temperature=0)
            outcomes.append(r.choices[0].text)
        except openai.APIStatusError as e:
            outcomes.append(e.status_code)
    threads = [threading.Thread(target=one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    expected = generate(triton.http, PROMPT, greedy(4)).text
    assert len(outcomes) == 4 and all(o in (expected, 503) for o in outcomes), outcomes
    assert expected in outcomes
