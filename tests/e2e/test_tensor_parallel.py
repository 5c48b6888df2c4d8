"""target_model at tensor-parallel degree 2 on a real tritonserver (gloo, two processes on the
CPU): the embedded pair's greedy text equals degree 1's over 16 held-out prompts x 128 tokens,
speculative equals target-only at degree 2, seeded sampling is reproducible, and a killed rank 1
is recovered by the supervisor with the same text afterwards."""
from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from specdec.serving import procs
from specdec_client import GenerationParams, generate
from tests.e2e.conftest import heldout_prompts, launch, wait_for

PROMPTS = heldout_prompts(16)
TOKENS = 128


@pytest.fixture(scope="module")
def tp_server(tmp_path_factory):
    yield from launch(tmp_path_factory, {"SPECDEC_TENSOR_PARALLEL": "2",
                                         "SPECDEC_HEALTH_INTERVAL_S": "0.5"})


def texts(server, params: GenerationParams, prompts=PROMPTS) -> list[str]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda p: generate(server.http, p, params).text, prompts))


def greedy(k: int) -> GenerationParams:
    return GenerationParams(max_tokens=TOKENS, temperature=0.0, num_draft_tokens=k)


def rank_one(server) -> int:
    """target_model's worker process (rank 1): a child of its backend process."""
    backend = server.backend_pid("target_model")
    workers = [pid for pid in procs.children(backend)
               if b"specdec.parallel_worker" in b" ".join(procs._argv(pid))]
    assert len(workers) == 1, workers
    return workers[0]


def test_degree_two_equals_degree_one_and_speculation_equals_target_only(server, tp_server):
    one = texts(server, greedy(0))
    two = texts(tp_server, greedy(0))
    assert two == one and all(two)
    assert texts(tp_server, greedy(4)) == two
    seeded = GenerationParams(max_tokens=32, temperature=0.8, seed=11, num_draft_tokens=4)
    assert texts(tp_server, seeded, PROMPTS[:4]) == texts(tp_server, seeded, PROMPTS[:4])


def test_killed_rank_one_is_recovered_with_exact_output(tp_server):
    before = texts(tp_server, greedy(0), PROMPTS[:4])
    old = rank_one(tp_server)
    os.kill(old, signal.SIGKILL)
    # Requests fail (retryably) until the supervisor has reloaded target_model: a new rank 0
    # and a new rank 1.
    assert wait_for(lambda: _answers(tp_server), timeout=180)
    assert rank_one(tp_server) != old
    assert texts(tp_server, greedy(0), PROMPTS[:4]) == before


def _answers(server) -> bool:
    try:
        return bool(generate(server.http, PROMPTS[0], greedy(0)).text)
    except Exception:   # noqa: BLE001 (down until restarted)
        return False
