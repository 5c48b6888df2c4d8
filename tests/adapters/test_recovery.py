"""specdec.serving.recovery: which errors mean a model is down, and the supervisor's restarts."""
import pytest

from specdec.serving import recovery
from specdec.serving.recovery import Supervisor, is_down
from specdec.serving.settings import SettingsError, SupervisorSettings

DEAD = "Stub process 'draft_model_0_0' is not healthy."
UNLOADED = ("Model draft_model - Error when running inference: Failed for execute the inference "
            "request. Model 'draft_model' is not ready.")


@pytest.mark.parametrize("message,down", [
    (DEAD, True), (UNLOADED, True), ("Request for unknown model: 'draft_model' is not found", True),
    ("Server not ready", False),                   # the whole server starts or stops
    ("sequence 7 is not open (start position 3 != 0)", False),   # the model answered
])
def test_is_down(message, down):
    assert is_down(message) is down


class World:
    """Models whose ping answers come from `errors`; reload() brings one back or fails."""

    def __init__(self, models):
        self.errors = {m: None for m in models}
        self.reloads, self.restarted, self.fail_reload = [], [], False

    def check(self, model):
        return self.errors[model]

    def reload(self, model):
        self.reloads.append(model)
        if self.fail_reload:
            raise RuntimeError("out of memory")
        self.errors[model] = None


def supervisor(world, interval_s=1.0):
    return Supervisor(list(world.errors), world.check, world.reload, interval_s,
                      lambda model, s: world.restarted.append(model))


def test_a_model_that_never_answered_is_not_restarted():
    """At startup the supervisor loads beside models still loading: never unload those."""
    w = World(["draft_model", "target_model"])
    w.errors["target_model"] = UNLOADED
    s = supervisor(w)
    s.sweep()
    assert w.reloads == [] and s.state["target_model"]["up"] is None
    assert s.state["draft_model"]["up"] is True


def test_a_dead_model_is_restarted_once_and_counted():
    w = World(["draft_model", "target_model"])
    s = supervisor(w)
    s.sweep()
    w.errors["draft_model"] = DEAD
    s.sweep()
    assert w.reloads == ["draft_model"] and w.restarted == ["draft_model"]
    assert s.state["draft_model"]["up"] is True and s.state["draft_model"]["restarts"] == 1
    assert s.state["draft_model"]["last_restart_s"] is not None
    s.sweep()
    assert w.reloads == ["draft_model"]        # back: nothing more to do
    assert s.state["target_model"]["restarts"] == 0


def test_an_error_answer_is_not_a_dead_model():
    w = World(["target_model"])
    s = supervisor(w)
    s.sweep()
    w.errors["target_model"] = "sequence 0 is not open"
    s.sweep()
    assert w.reloads == [] and s.state["target_model"]["up"] is True


def test_a_failed_restart_backs_off_and_is_retried(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(recovery.time, "monotonic", lambda: now[0])
    w = World(["draft_model"])
    s = supervisor(w, interval_s=2.0)
    s.sweep()
    w.errors["draft_model"], w.fail_reload = DEAD, True
    s.sweep()
    assert w.reloads == ["draft_model"] and w.restarted == []
    assert s.state["draft_model"]["up"] is False
    assert "restart failed: out of memory" in s.state["draft_model"]["error"]
    now[0] += 1.0
    s.sweep()
    assert len(w.reloads) == 1                 # backing off: 2 s
    now[0] += 1.5
    s.sweep()
    assert len(w.reloads) == 2                 # retried, failed again: 4 s now
    now[0] += 3.0
    s.sweep()
    assert len(w.reloads) == 2
    w.fail_reload = False
    now[0] += 1.5
    s.sweep()
    assert len(w.reloads) == 3 and w.restarted == ["draft_model"]
    assert s.state["draft_model"] == {"up": True, "restarts": 1, "last_restart_s": 0.0,
                                      "error": None}


def test_reload_unloads_then_loads():
    calls = []

    class Pb:
        def unload_model(self, name):
            calls.append(("unload", name))
            raise RuntimeError("not loaded")   # already gone: load anyway

        def load_model(self, name):
            calls.append(("load", name))

    recovery.reload(Pb(), "target_model")
    assert calls == [("unload", "target_model"), ("load", "target_model")]


def test_supervisor_settings(monkeypatch):
    assert SupervisorSettings.parse({}).health_interval_s == 2.0
    monkeypatch.setenv("SPECDEC_HEALTH_INTERVAL_S", "0.5")
    assert SupervisorSettings.parse({}).health_interval_s == 0.5
    monkeypatch.setenv("SPECDEC_HEALTH_INTERVAL_S", "0")
    with pytest.raises(SettingsError, match="health_interval_s"):
        SupervisorSettings.parse({})
