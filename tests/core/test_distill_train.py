"""The draft's start (layer copy), the loss going down, and resuming an interrupted run."""
import pytest
import torch
from safetensors.torch import load_file

from tests.core.distill_helpers import distill, interrupt, report, tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("distill") / "target")


def test_copy_of_every_layer_is_the_target_itself(target, tmp_path):
    assert distill(target, tmp_path / "d", "--layers", "4", "--steps", "0") == 0
    want = load_file(target / "model.safetensors")
    got = load_file(tmp_path / "d" / "model.safetensors")
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)
    # ...so the measurement must find every draft token accepted.
    assert report(tmp_path / "d")["heldout"]["acceptance_by_position"] == [1.0] * 4


def test_training_lowers_the_kl_to_the_target(target, tmp_path):
    assert distill(target, tmp_path / "d", "--layers", "1", "--steps", "24",
                   "--checkpoint-every", "8", "--lr", "3e-3") == 0
    losses = [e["loss"] for e in report(tmp_path / "d")["history"][1:]]
    assert len(losses) == 3 and losses[-1] < 0.8 * losses[0], losses


RESUMED = ("--steps", "6", "--layers", "2")


@pytest.fixture(scope="module")
def whole(target, tmp_path_factory):
    """The run that is never interrupted."""
    out = tmp_path_factory.mktemp("whole") / "d"
    assert distill(target, out, *RESUMED) == 0
    return out


@pytest.mark.parametrize("fault,resumes_at", [("interrupt:3", 3), ("term:3", 3), ("crash:3", 2)])
def test_interrupted_run_resumes_from_its_checkpoint(target, whole, tmp_path, monkeypatch,
                                                      capsys, fault, resumes_at):
    """Ctrl-C and SIGTERM save the steps done; a crash (a process killed hard) loses those since
    the last periodic checkpoint. Either way the rerun continues there and ends where a run that was
    never interrupted ends, weight for weight."""
    args = RESUMED
    saved = interrupt(target, tmp_path / "cut", args, fault, monkeypatch)
    assert saved == [f"step-{resumes_at:07d}"]
    capsys.readouterr()
    assert distill(target, tmp_path / "cut", *args) == 0
    err = capsys.readouterr().err
    assert "resuming the run" in err and f"{resumes_at}/6" in err
    want, cut = (load_file(d / "model.safetensors") for d in (whole, tmp_path / "cut"))
    assert all(torch.equal(want[k], cut[k]) for k in want)
    assert [e["step"] for e in report(tmp_path / "cut")["history"]][-1] == 6


def test_loss_in_chunks_equals_the_loss_in_one_piece(target):
    """A 128k vocabulary needs the logits a chunk of tokens at a time: same loss, same grads."""
    import json

    from specdec.distill import draft, train
    from specdec.runtime.engine import Engine
    cfg = json.loads((target / "config.json").read_text())
    teacher = Engine.load(str(target), 3, 16, torch.float32, torch.device("cpu"))
    model = draft.build(draft.layer_copy_config(cfg, [0, 3]), target, [0, 3], seed=0)
    tokens = torch.randint(0, 4096, (3, 16), generator=torch.Generator().manual_seed(0))
    lengths = torch.tensor([16, 9, 1])
    results = []
    for chunk in (10**6, 7):
        loss = train.kl_loss(model, teacher, tokens, lengths, chunk)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
        model.zero_grad()
    (one, grads_one), (chunked, grads_chunked) = results
    assert one > 0
    torch.testing.assert_close(chunked, one)
    for a, b in zip(grads_chunked, grads_one):
        torch.testing.assert_close(a, b)
