"""specdec.hooks.faults: the fault scripts the end-to-end tests give draft_model."""
import os
import re

import pytest

from specdec.hooks import faults
from specdec.serving.adapter import triton_error
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import SettingsError
from tests.adapters import fake_pb


def test_a_script_runs_its_steps_in_order_then_stops():
    slept = []
    inj = faults.Injector(faults.parse("error*2,delay=0.5*1,unavailable*2"), slept.append)
    got = [inj.before(1)[0] for _ in range(7)]
    kinds = [None if e is None else ("unavailable" if e.unavailable else "error") for e in got]
    assert kinds == ["error", "error", None, "unavailable", "unavailable", None, None]
    assert slept == [0.5]   # the third call answered late


def test_a_batch_shares_one_delay_and_counts_each_call():
    slept = []
    inj = faults.Injector(faults.parse("delay=2*3,error"), slept.append)
    first = inj.before(4)
    assert first[:3] == [None, None, None] and isinstance(first[3], faults.InjectedFault)
    assert slept == [2.0]
    assert all(e is not None for e in inj.before(5))   # the open-ended last step
    assert slept == [2.0]


def test_injected_errors_map_to_their_codes():
    err, unavailable = faults.InjectedFault("x", False), faults.InjectedFault("y", True)
    assert triton_error(fake_pb, err).code() == fake_pb.TritonError.INTERNAL
    assert triton_error(fake_pb, unavailable).code() == fake_pb.TritonError.UNAVAILABLE


def test_no_fault_by_default_and_a_bad_script_fails_the_load(monkeypatch):
    assert faults.Injector(faults.parse(EngineSettings.parse({}, "draft").fault)).before(3) == \
        [None, None, None]
    monkeypatch.setenv("SPECDEC_DRAFT_FAULT", "error*2,explode")
    with pytest.raises(SettingsError, match="'explode'"):
        EngineSettings.parse({}, "draft")
    assert EngineSettings.parse({}, "target").fault == ""   # per role


def test_a_script_runs_in_a_models_first_process_on_a_server_only(tmp_path):
    steps = faults.parse("error*2")
    assert faults.first_process(steps, "draft_model", "41.7", str(tmp_path)) == steps
    assert faults.first_process(steps, "draft_model", "41.7", str(tmp_path)) == []  # restarted
    assert faults.first_process(steps, "target_model", "41.7", str(tmp_path)) == steps
    assert faults.first_process(steps, "draft_model", "41.9", str(tmp_path)) == steps  # new server
    assert faults.first_process([], "none", "41.7", str(tmp_path)) == [] and \
        not (tmp_path / "specdec-fault-41.7-none").exists()   # no script, no marker
    # By default the server is this process's parent, by pid and start time.
    assert faults.first_process(steps, "m", markers=str(tmp_path)) == steps
    (marker,) = tmp_path.glob("specdec-fault-*-m")
    assert re.fullmatch(rf"specdec-fault-{os.getppid()}\.\d+-m", marker.name)
