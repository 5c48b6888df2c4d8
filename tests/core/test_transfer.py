"""Between a forward's launch and the call's one read back, the engine puts nothing on the
device by a blocking copy: on CUDA that copy synchronizes the stream, holding the host until
the forward ends and leaving the GPU idle while the host then launches the rest of the call
(specdec/runtime/transfer.py). The CPU runs the same code, so the pattern is checked here."""
import pytest
import torch

from specdec.runtime.engine import Engine
from specdec.records import ProposeCall, VerifyCall
from specdec.runtime.sampling import SamplingParams
from tests.core.conftest import engines


def _names_a_device(args, kwargs) -> bool:
    return "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args)


@pytest.fixture
def blocking_after_forward(monkeypatch):
    """The blocking copies to a device made after a forward and before the next read back."""
    state = {"pending": False, "copies": []}
    forward, to, tensor, tolist = Engine._forward, torch.Tensor.to, torch.tensor, \
        torch.Tensor.tolist

    def traced_forward(self, batch):
        out = forward(self, batch)
        state["pending"] = True
        return out

    def traced_to(self, *args, **kwargs):
        if state["pending"] and _names_a_device(args, kwargs) and not kwargs.get("non_blocking"):
            state["copies"].append(f"Tensor.to{args}")
        return to(self, *args, **kwargs)

    def traced_tensor(*args, **kwargs):
        if state["pending"] and kwargs.get("device") is not None:
            state["copies"].append("torch.tensor(..., device=...)")
        return tensor(*args, **kwargs)

    def traced_tolist(self):   # the read back: the stream is drained after it
        state["pending"] = False
        return tolist(self)
    monkeypatch.setattr(Engine, "_forward", traced_forward)
    monkeypatch.setattr(torch.Tensor, "to", traced_to)
    monkeypatch.setattr(torch, "tensor", traced_tensor)
    monkeypatch.setattr(torch.Tensor, "tolist", traced_tolist)
    return state["copies"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_verification_copies_nothing_blocking_after_its_forward(pair_dir, temperature,
                                                                  blocking_after_forward):
    target, _ = engines(pair_dir)
    params = SamplingParams(temperature=temperature, seed=7)
    target.verify([VerifyCall(1, 0, [5, 6, 7, 8], [], None, params),
                   VerifyCall(2, 0, [9, 10], [], None, params)])
    assert not blocking_after_forward
    # A draft model's sampled proposal brings its q from draft_model's process (host memory)
    q = torch.softmax(torch.randn(1, target.vocab_size), -1) if temperature else None
    verdicts = target.verify([VerifyCall(1, 4, [11], [12, 13, 14], None, params),
                              VerifyCall(2, 2, [15], [16], q, params)])
    assert [len(v.tokens) >= 1 for v in verdicts] == [True, True]
    assert blocking_after_forward == []


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_proposal_copies_nothing_blocking_between_its_steps(pair_dir, temperature,
                                                              blocking_after_forward):
    _, draft = engines(pair_dir)
    params = SamplingParams(temperature=temperature, seed=7)
    proposals = draft.propose([ProposeCall(1, 0, [5, 6, 7], 4, params),
                               ProposeCall(2, 0, [8, 9], 2, params)])
    assert [len(p.tokens) for p in proposals] == [4, 2]
    assert blocking_after_forward == []
