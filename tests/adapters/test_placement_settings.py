"""Where the draft model runs ($SPECDEC_DRAFT_PLACEMENT), read alike by target_model, draft_model
and the orchestrator; what the orchestrator derives from it; calls per round by placement."""
import pytest

from specdec.records import Proposer, Round
from specdec.serving.metrics import Metrics
from specdec.serving.settings import InTargetSettings, OrchestratorSettings, SettingsError
from tests.adapters import fake_pb

DRAFT, NGRAM, EAGLE = Proposer.DRAFT, Proposer.NGRAM, Proposer.EAGLE


@pytest.mark.parametrize("env,placement", [
    ({}, "target"),
    ({"SPECDEC_DRAFT_DEVICE": "cpu"}, "separate"),              # a device of its own
    ({"SPECDEC_DRAFT_DEVICE": "auto"}, "target"),
    ({"SPECDEC_TENSOR_PARALLEL": "2"}, "separate"),             # a sharded target
    ({"SPECDEC_TARGET_DEVICES": "cuda:0,cuda:1"}, "separate"),
    ({"SPECDEC_TARGET_DEVICES": "cuda:1", "SPECDEC_DRAFT_DEVICE": "cuda:1"}, "target"),
    ({"SPECDEC_DRAFT_PLACEMENT": "separate"}, "separate"),
    ({"SPECDEC_DRAFT_PLACEMENT": "target", "SPECDEC_DRAFT_DEVICE": "cpu"}, "target"),
])
def test_auto_places_the_draft_in_the_target_unless_it_has_a_device_or_the_target_is_sharded(
        monkeypatch, env, placement):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert InTargetSettings.parse({}).draft_placement == placement
    s = OrchestratorSettings.parse({})
    assert s.drafters.draft_placement == placement
    assert s.in_target == ((DRAFT,) if placement == "target" else ())
    assert s.proposers == (DRAFT, NGRAM, Proposer.SUFFIX)


def test_bad_placement_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("SPECDEC_DRAFT_PLACEMENT", "gpu")
    with pytest.raises(SettingsError, match="draft_placement 'gpu': expected auto, target"):
        OrchestratorSettings.parse({})


def test_in_target_proposers_and_the_default(monkeypatch):
    monkeypatch.setenv("SPECDEC_EAGLE_HEAD", "/h")
    s = OrchestratorSettings.parse({})
    assert s.in_target == (DRAFT, EAGLE) and s.proposer == EAGLE
    assert "in speculative_decoding's process (draft_placement target)" in s.start_line()
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", "none")
    monkeypatch.setenv("SPECDEC_MEDUSA_HEADS", "/m")
    monkeypatch.setenv("SPECDEC_SELF_SKIP", "3,5")
    s = OrchestratorSettings.parse({})
    assert s.proposers == (NGRAM, Proposer.SUFFIX, EAGLE, Proposer.SELF, Proposer.MEDUSA)
    assert s.in_target == (EAGLE, Proposer.SELF, Proposer.MEDUSA) and not s.draft_in_target
    assert s.missing(DRAFT) and s.missing("hybrid") is None
    monkeypatch.setenv("SPECDEC_EAGLE_HEAD", "none")
    assert OrchestratorSettings.parse({}).proposer == Proposer.MEDUSA
    monkeypatch.delenv("SPECDEC_MEDUSA_HEADS")
    s = OrchestratorSettings.parse({})
    assert s.proposer == Proposer.SELF and "skipping layers 3,5" in s.start_line()
    monkeypatch.delenv("SPECDEC_SELF_SKIP")
    s = OrchestratorSettings.parse({})
    assert "needs Medusa heads, and $SPECDEC_MEDUSA_HEADS" in f"needs {s.missing('medusa')}"
    assert "layers to skip" in s.missing("self") and s.missing("hybrid")


@pytest.mark.parametrize("in_target,placement,calls", [
    ((DRAFT,), "target", 1.0), ((), "draft_model", 2.0)])
def test_calls_per_round_by_placement(in_target, placement, calls):
    m = Metrics(fake_pb, "placement_test", max_draft_tokens=8, in_target=in_target)
    for _ in range(3):
        m.round(Round(k=4, accepted=2, draft_s=0.001, verify_s=0.01, proposer="draft"))
    m.round(Round(k=3, accepted=1, draft_s=1e-5, verify_s=0.01, proposer="ngram"))
    m.flush()

    def of(name, **labels):
        (metric,) = fake_pb.metrics(name, model="placement_test", **labels)
        return metric.value()
    assert of("specdec_bls_calls_per_round", proposer="draft", placement=placement) == calls
    assert of("specdec_bls_calls_total", proposer="draft") == 3 * calls
    assert of("specdec_bls_calls_per_round", proposer="ngram", placement="orchestrator") == 1.0
