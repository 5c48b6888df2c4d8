"""Where the draft runs (SPECDEC_DRAFT_DEVICE: the target's first device by default, a GPU of its
own, or the CPU), refusals of devices this machine lacks by field and value, and the memory check
at load over weights and KV per rank."""
from __future__ import annotations

import pytest
import torch

from specdec.runtime import engine as engine_module, memory
from specdec.runtime.config import CheckpointError, ModelArgs
from specdec.runtime.kv_cache import KVCache
from specdec.runtime.tensor_parallel.parallel import Shard, layout, local_args
from specdec.serving.engine_model import DraftModel
from specdec.serving.engine_settings import EngineSettings, check_device
from specdec.serving.settings import SettingsError
from specdec.runtime.weights import load_model
from tests.adapters import fake_pb
from tests.adapters.conftest import engine_config

PARAMS = {"draft_model_path": "/d", "target_model_path": "/t"}


def draft(monkeypatch, **env) -> EngineSettings:
    for name, value in env.items():
        monkeypatch.setenv(f"SPECDEC_{name.upper()}", value)
    return EngineSettings.parse(dict(PARAMS), "draft")


def test_the_draft_follows_the_target_unless_told(monkeypatch):
    assert draft(monkeypatch).device == "auto"                       # SPECDEC_DEVICE, as before
    assert draft(monkeypatch, device="cpu").device == "cpu"
    # the target's first device, where the target names its devices
    assert draft(monkeypatch, target_devices="cuda:2,cuda:3").device == "cuda:2"


@pytest.mark.parametrize("value", ["cpu", "cuda", "cuda:1", "cuda:7"])
def test_draft_device_overrides_device_for_the_draft_only(monkeypatch, value):
    s = draft(monkeypatch, device="cuda:0", target_devices="cuda:0,cuda:1", draft_device=value)
    assert s.device == value and s.draft_device == value
    target = EngineSettings.parse(dict(PARAMS), "target")
    assert target.device == "cuda:0" and target.rank_devices() == [torch.device("cuda", 0),
                                                                   torch.device("cuda", 1)]


@pytest.mark.parametrize("value", ["gpu1", "cuda:x", "cuda:-1", "mps", "cuda:0,cuda:1"])
def test_a_malformed_draft_device_fails_the_parse_by_name(monkeypatch, value):
    with pytest.raises(SettingsError, match=f"draft_device {value!r}"):
        draft(monkeypatch, draft_device=value)


def fake_cuda(monkeypatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


def test_devices_this_machine_lacks_are_refused_by_field_and_value(monkeypatch):
    fake_cuda(monkeypatch, 2)
    check_device(torch.device("cuda", 1), "draft_device")
    check_device(torch.device("cpu"), "draft_device")
    with pytest.raises(SettingsError, match=r"draft_device 'cuda:3': 2 CUDA device\(s\) visible"):
        check_device(torch.device("cuda", 3), "draft_device")
    fake_cuda(monkeypatch, 0)
    with pytest.raises(SettingsError, match="device 'cuda': no CUDA device on this machine"):
        check_device(torch.device("cuda"), "device")


def test_draft_model_refuses_a_missing_gpu_at_load(checkpoints, monkeypatch):
    fake_cuda(monkeypatch, 2)
    monkeypatch.setenv("SPECDEC_DRAFT_DEVICE", "cuda:3")
    with pytest.raises(SettingsError, match="draft_device 'cuda:3'"):
        DraftModel(fake_pb, engine_config(checkpoints, "draft"))


def test_draft_model_on_the_cpu_beside_a_target_elsewhere(checkpoints, monkeypatch):
    """SPECDEC_DEVICE names the target's device; the draft's own setting puts it on the CPU."""
    monkeypatch.setenv("SPECDEC_DEVICE", "cuda:0")
    monkeypatch.setenv("SPECDEC_DRAFT_DEVICE", "cpu")
    model = DraftModel(fake_pb, engine_config(checkpoints, "draft"))
    assert model.engine.device == torch.device("cpu")


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_weight_bytes_are_what_a_rank_holds(checkpoints):
    target, _ = checkpoints
    args = ModelArgs.from_dir(target)
    whole = memory.weight_bytes(args, torch.float32)
    assert whole == param_bytes(load_model(target, torch.float32, torch.device("cpu")))
    per_rank = [memory.weight_bytes(local_args(args, layout(args, r, 2)), torch.bfloat16,
                                           Shard(r, 2)) for r in range(2)]
    # every sharded matrix halves; norms stay whole: a rank holds a little over half
    assert per_rank[0] == per_rank[1]
    assert whole / 4 < per_rank[0] < whole / 2


def test_the_load_refuses_weights_and_kv_that_do_not_fit(checkpoints, monkeypatch):
    target, _ = checkpoints
    args = ModelArgs.from_dir(target)
    kv = KVCache.bytes_needed(args.num_layers, 4, 64, args.num_kv_heads, args.head_dim,
                              torch.float32)
    weights = memory.weight_bytes(args, torch.float32)
    # room for the KV pool but not for the weights beside it: refused before any weight loads
    monkeypatch.setattr(memory, "free_memory", lambda device: kv + weights // 2)
    monkeypatch.setattr(engine_module, "load_model", lambda *a, **k: pytest.fail("loaded"))
    with pytest.raises(CheckpointError, match="weights .* GiB and a KV slot pool"):
        engine_module.Engine.load(target, 4, 64, torch.float32, torch.device("cpu"))


def test_ram_available_counts_the_page_cache(tmp_path):
    """MemAvailable, not MemFree: a machine whose memory sits in the page cache (checkpoints
    just written or read) can still hold a model."""
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24683520 kB\nMemFree:          272384 kB\n"
                       "MemAvailable:   24100000 kB\nBuffers:            1024 kB\n")
    assert memory.available_ram(str(meminfo)) == 24100000 * 1024
    assert memory.available_ram(str(tmp_path / "absent")) > 0   # sysconf's free pages
