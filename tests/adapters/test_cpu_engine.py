"""A CPU engine's settings: the CPU's own kernels (specdec/kernels/cpu) by default where they build,
off or required by SPECDEC_CPU_KERNELS, their threads by SPECDEC_KERNEL_THREADS (every core by
default), and the load line that says which."""
import os

import pytest

from specdec.kernels.cpu import build
from specdec.serving.engine_model import TargetModel
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import SettingsError
from tests.adapters import fake_pb
from tests.adapters.conftest import engine_config

needs_kernels = pytest.mark.skipif(build.load() is None, reason=f"{build.reason()}")


def load(checkpoints, capsys, **params) -> tuple[TargetModel, str]:
    config = engine_config(checkpoints, "target")
    config["parameters"].update({k: {"string_value": v} for k, v in params.items()})
    try:
        model = TargetModel(fake_pb, config)
    finally:
        build.set_threads(1)   # as the rest of the tests run
    line = [ln for ln in capsys.readouterr().err.splitlines() if "on the CPU" in ln
            or "the CPU kernels" in ln]
    assert len(line) == 1, line
    return model, line[0]


@needs_kernels
def test_the_kernels_serve_by_default_on_every_core(checkpoints, capsys):
    model, line = load(checkpoints, capsys)
    assert model.engine.cpu_kernel and model.engine.model.cpu_attention
    cores = len(os.sched_getaffinity(0))
    assert f"the CPU kernels ({cores} threads): linear layers and attention" in line


@needs_kernels
def test_threads_are_a_setting(checkpoints, capsys):
    _, line = load(checkpoints, capsys, kernel_threads="1")
    assert "the CPU kernels (1 threads)" in line


def test_off_serves_with_pytorchs_operators(checkpoints, capsys):
    model, line = load(checkpoints, capsys, cpu_kernels="off")
    assert not model.engine.cpu_kernel and not model.engine.model.cpu_attention
    assert line.startswith("specdec target_model: PyTorch's operators on the CPU")


def test_on_fails_the_load_where_they_cannot_build(checkpoints, monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setenv("SPECDEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "/bin/false")
    config = engine_config(checkpoints, "target")
    config["parameters"]["cpu_kernels"] = {"string_value": "on"}
    with pytest.raises(ValueError, match="cpu_kernel: .*/bin/false failed"):
        TargetModel(fake_pb, config)


@pytest.mark.parametrize("name,value,message", [("cpu_kernels", "maybe", "expected auto, on"),
                                                ("kernel_threads", "-1", r"0 \(every core\)")])
def test_bad_values_fail_the_load_by_name(name, value, message):
    with pytest.raises(SettingsError, match=f"{name} .*{message}"):
        EngineSettings.parse({"target_model_path": "/m", name: value}, "target")
