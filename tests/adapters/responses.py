"""Reading a fake request's responses (fake_pb), for the adapter tests of the orchestrator."""
from specdec import names
from tests.adapters import fake_pb

FINAL = fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PROMPTS = [[5, 17, 200, 33, 9], [40, 41, 42], list(range(60, 80)), [7]]


def out(response, name):
    return fake_pb.get_output_tensor_by_name(response, name).as_numpy()


def finish_reason(response) -> str:
    return out(response, names.FINISH_REASON)[0].decode()


def output_ids(request) -> list[int]:
    """The new ids of every response of a request, in order (ids after prefix_length)."""
    ids = []
    for r in request.sender.responses():
        assert not r.has_error(), r.error().message()
        ids += out(r, names.OUTPUT_IDS)[int(out(r, names.PREFIX_LENGTH)[0]):].tolist()
    return ids


def assert_one_final(request):
    """Exactly one FINAL flag, on the last send."""
    flags = [f for _, f in request.sender.sent]
    assert flags and flags[-1] == FINAL and flags.count(FINAL) == 1, flags


def assert_all_released(serving):
    assert serving.draft.engine.pool.active == 0
    assert serving.target.engine.pool.active == 0
    assert serving.gauge.history and serving.gauge.history[-1] == 0
