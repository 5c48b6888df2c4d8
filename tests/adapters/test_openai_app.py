"""The OpenAI gateway's routes over a scripted orchestrator (specdec/openai/app.py): n choices as
n requests, their chunks interleaved, usage and statistics over all of them, one failing choice
failing the request, and tool calls read out of the text, whole and streamed. End to end, with
the openai SDK against a real server: tests/e2e/test_openai.py."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from fastapi.testclient import TestClient

from specdec import names
from specdec.openai.app import create_app
from specdec.openai.limits import GatewaySettings, Limits
from specdec.openai.triton import SpecDecoding, TritonError
from specdec.serving.tokenizer import load_tokenizer
from specdec_client import GenerationParams
from tests.chat_templates import HERMES, tools_tokenizer

PROMPT_TOKENS = 5
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


class Scripted:
    """The orchestrator's responses to each request: its pieces of text (script(params)), the
    statistics on the last one; each piece a step of the event loop, so that concurrent
    requests interleave."""

    def __init__(self, script, fail_seed: int | None = None):
        self.script, self.fail_seed = script, fail_seed
        self.sent, self.closed = [], 0

    async def generate(self, prompt, params, stream, keep=frozenset(), extra=None):
        self.sent.append(params)
        try:
            pieces = self.script(params)
            if params.seed is not None and params.seed == self.fail_seed:
                raise TritonError("UNAVAILABLE: all 1 sequence slots stayed busy for 1.0s")
            for k, piece in enumerate(pieces):
                await asyncio.sleep(0)
                out = {names.TEXT_OUTPUT: piece}
                if k == len(pieces) - 1:
                    out.update({names.NUM_INPUT_TOKENS: PROMPT_TOKENS,
                                names.NUM_OUTPUT_TOKENS: len(pieces),
                                names.TOTAL_DRAFT_TOKENS: 4, names.TOTAL_ACCEPTED_DRAFT_TOKENS:
                                len(pieces) % 4, names.ACCEPTANCE_RATE: len(pieces) % 4 / 4,
                                names.NGRAM_DRAFT_TOKENS: 0, names.NGRAM_ACCEPTED_TOKENS: 0,
                                names.FINISH_REASON: "length"})
                yield out
        finally:
            self.closed += 1

    collect = SpecDecoding.collect

    async def ready(self):
        return True


def by_seed(params) -> list[str]:
    """Choice text that names its seed, one piece a word; seed s gives s % 5 + 2 words."""
    seed = params.seed
    return [f"s{seed}w{k} " for k in range(2 if seed is None else seed % 5 + 2)]


def client(server, tokenizer=None, **gateway) -> TestClient:
    from tests.adapters.test_openai_protocol import Templated
    limits = Limits(gateway=GatewaySettings(**gateway))
    return TestClient(create_app(server, tokenizer or Templated(), "m", limits))


def events(response) -> list[dict]:
    assert response.status_code == 200, response.text
    lines = [line for line in response.text.split("\n\n") if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]


def test_n_choices_are_n_requests_seeded_seed_plus_i():
    server = Scripted(by_seed)
    r = client(server).post("/v1/completions", json={"model": "m", "prompt": "p", "n": 3,
                                                      "seed": 10, "temperature": 0.8})
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(p.seed for p in server.sent) == [10, 11, 12]
    assert {p.temperature for p in server.sent} == {0.8}
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert [c["text"] for c in body["choices"]] == ["".join(by_seed(GenerationParams(seed=s)))
                                                    for s in (10, 11, 12)]
    tokens = [2 + s % 5 for s in (10, 11, 12)]   # 2, 3, 4
    assert body["usage"] == {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": sum(tokens),
                             "total_tokens": PROMPT_TOKENS + sum(tokens)}
    accepted = sum(t % 4 for t in tokens)
    assert body["specdec"]["total_draft_tokens"] == 12
    assert body["specdec"]["total_accepted_draft_tokens"] == accepted
    assert body["specdec"]["acceptance_rate"] == accepted / 12


def test_n_without_a_seed_leaves_each_its_own_random_seed():
    server = Scripted(by_seed)
    r = client(server).post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2})
    assert r.status_code == 200, r.text
    assert [p.seed for p in server.sent] == [None, None]
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]


def test_n_is_limited_by_the_setting():
    server = Scripted(by_seed)
    for n in (0, 3):
        r = client(server, max_n=2).post("/v1/completions",
                                         json={"model": "m", "prompt": "p", "n": n})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert "1..2" in r.json()["error"]["message"] and not server.sent


def test_streamed_choices_interleave_each_with_its_own_finish():
    server = Scripted(by_seed)
    chunks = events(client(server).post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 3, "seed": 0,
        "stream": True, "stream_options": {"include_usage": True}}))
    usage = chunks.pop()
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 2 + 3 + 4
    assert usage["usage"]["prompt_tokens"] == PROMPT_TOKENS
    assert usage["specdec"]["total_draft_tokens"] == 12
    order = [c["choices"][0]["index"] for c in chunks]
    assert order[:3] == [0, 1, 2]   # each choice's role first
    assert all(c["choices"][0]["delta"] == {"role": "assistant", "content": ""}
               for c in chunks[:3])
    content = [c for c in chunks[3:] if c["choices"][0]["delta"].get("content")]
    assert [c["choices"][0]["index"] for c in content] != sorted(
        c["choices"][0]["index"] for c in content)   # interleaved as they came
    for i in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
        assert "".join(c["delta"].get("content") or "" for c in mine) == \
            "".join(f"s{i}w{k} " for k in range(i + 2))
        assert [c["finish_reason"] for c in mine].count("length") == 1
        assert mine[-1]["finish_reason"] == "length"
    ends = [c for c in chunks if c["choices"][0]["finish_reason"]]
    assert [e["specdec"]["total_draft_tokens"] for e in ends] == [4, 4, 4]   # each its own
    assert all(c["usage"] is None for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_one_failing_choice_fails_the_request_and_stops_the_others(stream):
    server = Scripted(lambda p: ["a "] * 50, fail_seed=6)
    r = client(server).post("/v1/completions", json={
        "model": "m", "prompt": "p", "n": 3, "seed": 5, "stream": stream})
    assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
    assert len(server.sent) == 3 and server.closed == 3


def test_greedy_n_gives_identical_choices():
    server = Scripted(lambda p: ["same ", "text"])
    r = client(server).post("/v1/completions", json={"model": "m", "prompt": "p", "n": 2,
                                                      "temperature": 0})
    texts = [c["text"] for c in r.json()["choices"]]
    assert texts == ["same text", "same text"]


@pytest.fixture(scope="module")
def hermes(tmp_path_factory):
    return load_tokenizer(str(tools_tokenizer(tmp_path_factory.mktemp("tok") / "h", HERMES)))


CALL_PIECES = ["I will ", "check. <tool", '_call>{"name": "get_weather", ', '"arguments": ',
               '{"city": "Rome"}}</tool', "_call>"]


def test_tool_calls_answered_whole_and_streamed(hermes):
    server = Scripted(lambda p: CALL_PIECES)
    chat = {"model": "m", "messages": [{"role": "user", "content": "Rome?"}],
            "tools": [WEATHER]}
    gateway = client(server, hermes, tool_parser="auto")   # detected: hermes
    body = gateway.post("/v1/chat/completions", json=chat).json()
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == "I will check."
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    chunks = events(gateway.post("/v1/chat/completions", json={**chat, "stream": True}))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "I will check. "
    calls = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert calls[0]["index"] == 0 and calls[0]["id"].startswith("call_")
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""}
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Rome"}'
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "tool_calls"
    # tool_choice none: the same text is content, the finish reason the server's
    none = gateway.post("/v1/chat/completions", json={**chat, "tool_choice": "none"}).json()
    assert none["choices"][0]["message"]["content"] == "".join(CALL_PIECES)
    assert none["choices"][0]["finish_reason"] == "length"


class Endless(Scripted):
    """A generation that runs until it is stopped, a piece every 10 ms."""

    async def generate(self, prompt, params, stream, keep=frozenset(), extra=None):
        self.sent.append(params)
        try:
            for k in range(1000):
                await asyncio.sleep(0.01)
                yield {names.TEXT_OUTPUT: f"w{k} "}
        finally:
            self.closed += 1


def test_a_client_that_leaves_a_stream_stops_every_choice():
    server = Endless(None)
    with client(server).stream("POST", "/v1/completions", json={
            "model": "m", "prompt": "p", "n": 3, "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(10):
            next(lines)
    deadline = time.monotonic() + 10
    while server.closed < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(server.sent) == 3 and server.closed == 3
