"""`specdec probe`'s requests are no user's: marked by a request parameter, left out of
specdec_requests_total (specdec/serving/probe.py, metrics.py)."""
import json

from specdec import names
from specdec.serving import probe
from specdec.serving.metrics import Metrics, is_probe
from tests.adapters import fake_pb


class Request:
    def __init__(self, parameters: str):
        self._parameters = parameters

    def parameters(self) -> str:
        return self._parameters


def as_triton_passes_it(body: dict) -> Request:
    """A generate body's keys that are no input of the model reach it as request parameters
    (Triton's generate extension; checked on 2.51 with a model returning parameters())."""
    inputs = {names.INPUT_IDS, names.MAX_TOKENS}
    return Request(json.dumps({k: v for k, v in body.items() if k not in inputs}))


def test_the_probes_request_is_told_from_a_users():
    assert is_probe(as_triton_passes_it(probe.ORCHESTRATOR_BODY))
    user = {names.INPUT_IDS: [0], names.MAX_TOKENS: 0}
    assert not is_probe(as_triton_passes_it(user))
    for raw in ("", "{}", '{"specdec_probe": "true"}', "[1]", "not json"):
        assert not is_probe(Request(raw)), raw
    assert not is_probe(object())   # no parameters() at all


def test_a_probe_is_not_counted_among_the_requests():
    m = Metrics(fake_pb, "probe_test", max_draft_tokens=4)

    def invalid():
        (metric,) = fake_pb.metrics("specdec_requests_total", model="probe_test",
                                    finish_reason="invalid")
        return metric.value()
    m.finished("invalid", None, is_probe=True)
    assert invalid() == 0
    m.finished("invalid", None)
    assert invalid() == 1
