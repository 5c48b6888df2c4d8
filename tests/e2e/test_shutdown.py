"""SIGTERM during a stream: the stream completes, new requests are refused, the process exits.
For the OpenAI gateway alone (uvicorn's graceful shutdown), then for a pod's pair: tritonserver
under the launcher (which passes --exit-timeout-secs) and the gateway signalled together, a
stream through each. Both read the grace period from $SPECDEC_SHUTDOWN_GRACE_S. One server of
this module's own, the streams target-only greedy generations of a few seconds."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from specdec_client import GenerationParams, generate, generate_stream
from tests.e2e.conftest import (ROOT, Server, _free_port, _ready, heldout_prompts, start_gateway,
                                wait_for)

PROMPT = heldout_prompts(3)[2]
TARGET = ROOT / "models" / "default" / "target"   # the served tokenizer; no chat template needed
# Target-only, each target call held 40 ms (a fault script's delay): a stream is in flight for
# more than 6 s, past the 5 s the gateway once gave it, in a handful of tokens.
TOKENS = 160
TARGET_DELAY = "delay=0.04"
GRACE_S = "30"


def greedy(max_tokens: int = TOKENS) -> GenerationParams:
    return GenerationParams(max_tokens=max_tokens, temperature=0.0, num_draft_tokens=0)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The launcher with no --exit-timeout-secs among its flags: it comes from the setting."""
    http, grpc, metrics = _free_port(), _free_port(), _free_port()
    log = tmp_path_factory.mktemp("triton") / "tritonserver.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")}
    env["SPECDEC_SHUTDOWN_GRACE_S"] = GRACE_S
    env["SPECDEC_TARGET_FAULT"] = TARGET_DELAY
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specdec.launcher.launch", f"--http-port={http}",
             f"--grpc-port={grpc}", f"--metrics-port={metrics}"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"127.0.0.1:{metrics}", log,
                    proc.pid)
    try:
        if not wait_for(lambda: _ready(server.http) or proc.poll() is not None, 300) or \
                proc.poll() is not None:
            pytest.fail(f"tritonserver did not become ready:\n{log.read_text()[-4000:]}")
        yield proc, server
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


@pytest.fixture(scope="module")
def expected(server):
    return generate(server[1].http, PROMPT, greedy())


@pytest.fixture
def gateway(server, tmp_path_factory, monkeypatch):
    """A gateway (its environment is this process's) with the test's grace period and a
    max_tokens limit of its own, below the server's."""
    monkeypatch.setenv("SPECDEC_SHUTDOWN_GRACE_S", GRACE_S)
    monkeypatch.setenv("SPECDEC_MAX_TOKENS_LIMIT", str(TOKENS))
    proc, url = start_gateway(server[1].grpc, TARGET, tmp_path_factory)
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


def completion(url: str, max_tokens: int = TOKENS, stream: bool = True):
    body = {"model": TARGET.name, "prompt": PROMPT, "max_tokens": max_tokens,
            "temperature": 0, "num_draft_tokens": 0, "stream": stream}
    req = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=60)


def events(response):
    """The SSE stream's JSON events, up to [DONE]."""
    for line in response:
        line = line.decode().strip()
        if line == "data: [DONE]":
            return
        if line.startswith("data: "):
            yield json.loads(line[6:])


def refused(call) -> bool:
    try:
        call()
    except (OSError, urllib.error.URLError):   # connection refused, or closed unanswered
        return True
    return False


def test_the_gateway_finishes_a_stream_after_sigterm(gateway, expected):
    proc, url = gateway
    with pytest.raises(urllib.error.HTTPError) as over:   # its limit, not the server's 1024
        completion(url, TOKENS + 1, stream=False)
    assert over.value.code == 400 and json.loads(over.value.read())["error"]["param"] == \
        "max_tokens"
    with completion(url) as r:
        chunks = events(r)
        text = next(chunks)["choices"][0]["text"]
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: refused(lambda: completion(url, 4, stream=False)), 10)
        rest = list(chunks)
    text += "".join(c["choices"][0]["text"] for c in rest)
    assert rest[-1]["choices"][0]["finish_reason"] is not None
    assert text == expected.text
    assert proc.wait(60) in (0, -signal.SIGTERM)   # uvicorn re-raises the signal once done


def test_tritonserver_and_the_gateway_finish_their_streams_after_sigterm(server, gateway,
                                                                        expected):
    """A pod stopping: both containers get SIGTERM at once. The launcher forwards it to
    tritonserver, whose exit timeout is the setting's; a stream straight to Triton (HTTP) and
    one through the gateway (gRPC) both complete."""
    launcher, triton = server
    proc, url = gateway
    argv = open(f"/proc/{triton.triton_pid}/cmdline", "rb").read().split(b"\0")
    assert [a for a in argv if a.startswith(b"--exit-timeout-secs")] == \
        [f"--exit-timeout-secs={GRACE_S}".encode()]
    direct = generate_stream(triton.http, PROMPT, greedy())
    with completion(url) as r:
        chunks = events(r)
        via_gateway = next(chunks)["choices"][0]["text"]
        first = next(iter(direct))
        launcher.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGTERM)
        assert wait_for(lambda: refused(lambda: generate(triton.http, PROMPT, greedy(4),
                                                         timeout=10)), 10)
        via_gateway += "".join(c["choices"][0]["text"] for c in chunks)
    assert via_gateway == expected.text
    assert first + "".join(direct) == expected.text
    assert direct.result.finish_reason == expected.finish_reason
    assert proc.wait(60) in (0, -signal.SIGTERM)
    assert launcher.wait(60) in (0, 128 + signal.SIGTERM)
