"""$SPECDEC_SELF_SKIP above tensor-parallel degree 1 fails target_model's load by name: the
skipped view would run the target's sharded layers on rank 0 alone (docs/swift.md)."""
import pytest
import torch

from specdec.runtime.engine import Engine
from specdec.serving.drafters import attach
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import InTargetSettings, SettingsError
from specdec.runtime.weights import load_model
from tests.core.distill_helpers import DEFAULT_TARGET

CPU = torch.device("cpu")


def test_self_skip_is_refused_above_degree_one():
    target = Engine(load_model(DEFAULT_TARGET, torch.float32, CPU), 2, 64, CPU, cuda_graphs=False)
    it = InTargetSettings("separate", "2,4", "")
    with pytest.raises(SettingsError, match=r"SPECDEC_SELF_SKIP.*SPECDEC_TENSOR_PARALLEL\) 2"):
        attach(target, EngineSettings(max_sequences=2, max_seq_len=64, tensor_parallel=2), it,
               {}, CPU, torch.float32)
    assert not target.drafters
    attach(target, EngineSettings(max_sequences=2, max_seq_len=64), it, {}, CPU, torch.float32)
    assert list(target.drafters) == ["self"]
