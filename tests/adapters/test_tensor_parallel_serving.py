"""target_model at tensor-parallel degree 2 (gloo, a worker process on the CPU) behind the
orchestrator, over fake_pb's BLS: the tokens of degree 1, greedy with the draft model and
seeded sampling; a dead rank 1 answers the supervisor's ping with a retryable error that
recovery.py reads as a model down."""
import pytest

from specdec import names
from specdec.runtime.tensor_parallel import parallel
from specdec.serving import calls, recovery
from tests.adapters import fake_pb
from tests.adapters.conftest import orchestrator_request, run_all
from tests.adapters.responses import output_ids

PROMPTS = [[5, 9, 11, 3], [7, 7, 2], [40, 41, 42, 43, 44, 45], [13]]


def ping(serving):
    """The supervisor's ping (bls.ping): the release of a sequence that is not open."""
    [response] = serving.target.execute([fake_pb.Request(calls.release_inputs(0))])
    return response.error() if response.has_error() else None


def serve(serving, **fields) -> list[list[int]]:
    requests = [orchestrator_request(p, max_tokens=24, num_draft_tokens=3, **fields)
                for p in PROMPTS]
    run_all(serving.orchestrator(), requests)
    return [output_ids(r) for r in requests]


def test_degree_two_serves_degree_one_tokens_and_a_dead_rank_is_down(serving, monkeypatch):
    greedy, sampled = serve(serving), serve(serving, temperature=0.8, seed=7)
    monkeypatch.setenv("SPECDEC_TENSOR_PARALLEL", "2")
    monkeypatch.setenv("SPECDEC_CPU_THREADS", "1")
    serving.build()
    leader = serving.target.engine
    try:
        assert len(leader.workers) == 1 and leader.model.tp.world == 2
        assert serve(serving) == greedy
        again = serve(serving, temperature=0.8, seed=7)
        assert again == serve(serving, temperature=0.8, seed=7)   # reproducible by seed
        # float32 logits differ from degree 1's in the last bits at most: the same draws
        assert again == sampled
        assert ping(serving) is None
        leader.workers[0].kill()
        leader.workers[0].wait(10)
        error = ping(serving)
        assert error is not None and error.code() == fake_pb.TritonError.UNAVAILABLE
        assert names.UNAVAILABLE in error.message() and recovery.is_down(error.message())
    finally:
        leader.stop()
        parallel.close()


def test_shapes_that_do_not_divide_fail_the_load_by_name(checkpoints, monkeypatch):
    from specdec.runtime.config import CheckpointError
    from specdec.serving.engine_model import TargetModel
    from tests.adapters.conftest import engine_config
    monkeypatch.setenv("SPECDEC_TENSOR_PARALLEL", "3")
    with pytest.raises(CheckpointError, match="num_attention_heads 4 is not divisible by the "
                                              "tensor-parallel degree 3"):
        TargetModel(fake_pb, engine_config(checkpoints, "target"))
