"""`specdec distill --method eagle3`: the training-time test is the served head's computation,
its loss goes down, the draft vocabulary maps back to the target's ids, the head is written in
the speculators format and loads, runs resume, the held-out measurement is the served loop's,
and options of the other method are refused by name."""
import asyncio
import json

import pytest
import torch
from safetensors.torch import load_file

from specdec.distill import data, eagle3, measure
from specdec.proposers.eagle.checkpoint import load_head, save_speculators
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.drafting import HeadDrafter
from specdec.runtime.kv_cache import KVCache
from specdec.decoding.local import LocalVerifier
from specdec.decoding.loop import speculate
from specdec.runtime.batch import Batch
from specdec.records import Request
from specdec.runtime.weights import load_model
from tests.core.distill_helpers import distill, interrupt, report, tiny_target
from tests.core.eagle_helpers import trained_head_dir

CPU = torch.device("cpu")
EAGLE3 = ("--method", "eagle3", "--ttt-steps", "2")


# Shapes this small gain nothing from a second thread, which a busy machine schedules late.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return tiny_target(tmp_path_factory.mktemp("eagle3") / "target")


def test_ttt_steps_are_what_the_served_head_computes(pair_dir):
    """Step s at branch t equals the serving forward (KV slot pool) drafting s tokens past the
    committed position t, fed the data's tokens: the diagonal attention sees what serving sees."""
    model = load_model(pair_dir[0], torch.float64, CPU)
    head = eagle3.new_head(model, (0, 0, 1), torch.arange(97), seed=1).double()
    a, h = model.args, head.args.layer
    tokens = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(0))
    cache = KVCache(a.num_layers, 2, 32, a.num_kv_heads, a.head_dim, torch.float64, CPU)
    _, features = eagle3.teacher(model, cache, tokens, torch.tensor([12, 12]), (0, 0, 1))
    with torch.no_grad():
        outs = eagle3.ttt_outputs(head, features, tokens, 3)
        own = KVCache(1, 2, 32, h.num_kv_heads, h.head_dim, torch.float64, CPU)
        for t in (0, 4, 8):
            # catch-up: pairs (feature j, token j + 1) at positions 0..t, as after a verification
            x = head(Batch.build(tokens[:, 1:t + 2], [0, 0], [0, 1], own, CPU),
                     head.fc(features[:, :t + 1]), own)[:, -1:]
            torch.testing.assert_close(x[:, 0], outs[0][:, t], rtol=0, atol=1e-10)
            for s in (1, 2):   # a draft step: the next token at position t + s
                x = head(Batch.build(tokens[:, t + 1 + s:t + 2 + s], [t + s] * 2, [0, 1], own,
                                     CPU), x, own)
                torch.testing.assert_close(x[:, 0], outs[s][:, t], rtol=0, atol=1e-10)


def test_ttt_loss_goes_down(pair_dir):
    model = load_model(pair_dir[0], torch.float32, CPU)
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 97, (32, 24), generator=gen)
    ds = data.Data(rows, torch.full((32,), 24), torch.zeros(0, dtype=torch.int64), [], {})
    used = torch.arange(97)
    trainer = eagle3.Trainer(model, eagle3.new_head(model, (0, 0, 1), used), used, 8, 24, 5e-3, 3)
    losses = [trainer.step(*data.step_batch(ds, i, 0, 8, 24, 8), 5e-3) for i in range(30)]
    assert len(trainer.last_steps) == 3
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5]), losses


def test_draft_vocabulary_and_d2t(pair_dir, tmp_path):
    """The most frequent ids (the lower id first on a tie, unseen ids from 0 up), by id; a draft
    id i drafts target id i + d2t[i], and the saved head maps the same way."""
    counts = torch.zeros(97, dtype=torch.int64)
    counts[[50, 7, 90, 3, 60]] = torch.tensor([9, 5, 5, 1, 5])
    used = eagle3.draft_vocabulary(counts, 7)
    assert used.tolist() == [0, 1, 3, 7, 50, 60, 90]   # 9; 5, 5, 5 (7 < 60 < 90); 1; unseen 0, 1
    assert eagle3.draft_vocabulary(counts, 3).tolist() == [7, 50, 60]
    ds = data.Data(torch.tensor([[5, 5, 9, 0], [9, 5, 2, 2]]), torch.tensor([3, 2]),
                   torch.tensor([2, 9]), [], {})
    assert eagle3.token_counts(ds, 10).tolist() == [0, 0, 1, 0, 0, 3, 0, 0, 0, 3]
    model = load_model(pair_dir[0], torch.float32, CPU)
    head = eagle3.new_head(model, (0, 0, 1), used)
    assert head.d2t.tolist() == [0, 0, 1, 4, 46, 55, 84]
    assert head.target_ids(torch.arange(7)).tolist() == used.tolist()
    # lm_head starts as the target's rows of those ids: the draft logit of id i is the target's
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(head.target_logits(hidden, 97)[:, used],
                               model.logits(model.model.norm(hidden))[:, used])
    assert torch.isinf(head.target_logits(hidden, 97)[:, 2]).all()
    save_speculators(head, tmp_path / "h", "tiny", embeddings=False)
    loaded = load_head(tmp_path / "h", model, torch.float32, CPU)
    assert loaded.d2t.tolist() == head.d2t.tolist()
    assert load_file(tmp_path / "h" / "model.safetensors")["t2d"].nonzero()[:, 0].tolist() == \
        used.tolist()


def test_aux_layers_for_small_and_large_targets():
    assert eagle3.aux_layers(32) == (1, 15, 28)   # EAGLE-3's, as Llama-3.1-8B's heads have them
    assert eagle3.aux_layers(7) == (1, 2, 3)
    assert eagle3.aux_layers(6) == (1, 3, 4)      # the default target
    assert eagle3.aux_layers(4) == (0, 2, 3)
    assert eagle3.aux_layers(2) == (0, 0, 1)


@pytest.fixture(scope="module")
def whole(target, tmp_path_factory):
    """A run that is never interrupted."""
    out = tmp_path_factory.mktemp("whole") / "head"
    assert distill(target, out, *EAGLE3, "--steps", "6", "--draft-vocab", "1000") == 0
    return out


def test_the_head_is_written_in_the_speculators_format(target, whole):
    cfg = json.loads((whole / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["architectures"] == ["Eagle3Speculator"]
    layer = cfg["transformer_layer_config"]
    assert (layer["hidden_size"], layer["vocab_size"], layer["num_hidden_layers"]) == (64, 4096, 1)
    assert cfg["draft_vocab_size"] == 1000 and cfg["target_hidden_size"] == 64
    assert cfg["norm_before_residual"] is False
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]   # layers (0, 2, 3)' outputs
    spec = cfg["speculators_config"]
    assert spec["verifier"] == {"name_or_path": str(target),
                                "architectures": ["LlamaForCausalLM"]}
    assert spec["proposal_methods"][0]["speculative_tokens"] == 4
    weights = load_file(whole / "model.safetensors")
    assert "embed_tokens.weight" not in weights                    # the target's, shared
    assert weights["lm_head.weight"].shape == (1000, 64)
    assert weights["fc.weight"].dtype == torch.float32             # the target's dtype
    assert weights["d2t"].dtype == torch.int64 and weights["t2d"].sum() == 1000
    model = load_model(target, torch.float32, CPU)
    head = load_head(whole, model, torch.float32, CPU)
    assert head.args.aux_layers == (0, 2, 3) and head.embed_tokens.weight is \
        model.model.embed_tokens.weight
    r = report(whole)
    assert r["method"] == "eagle3" and r["head"]["aux_layers"] == [0, 2, 3]
    assert r["head"]["draft_vocab_size"] == 1000 and 0 < r["head"]["draft_vocab_coverage"] <= 1
    assert r["training"]["ttt_steps"] == 2 and len(r["training"]["final_loss_by_ttt_step"]) == 2
    h = r["heldout"]
    assert len(h["acceptance_by_position"]) == 4 and h["c"] > 0
    assert all("accepted_per_round" in row for row in h["per_k"].values())
    assert not (whole / ".distill").exists()


@pytest.mark.parametrize("fault,resumes_at", [("interrupt:3", 3), ("crash:3", 2)])
def test_an_interrupted_run_resumes(target, whole, tmp_path, monkeypatch, capsys, fault,
                                    resumes_at):
    args = (*EAGLE3, "--steps", "6", "--draft-vocab", "1000")
    saved = interrupt(target, tmp_path / "cut", args, fault, monkeypatch)
    assert saved == [f"step-{resumes_at:07d}"]
    assert "--ttt-steps 2 -> 3" in _refused(capsys, target, tmp_path / "cut", *args[:2],
                                            "--ttt-steps", "3", *args[4:])
    assert distill(target, tmp_path / "cut", *args) == 0
    err = capsys.readouterr().err
    assert "resuming the run" in err and f"{resumes_at}/6" in err
    want, cut = (load_file(d / "model.safetensors") for d in (whole, tmp_path / "cut"))
    assert want.keys() == cut.keys() and all(torch.equal(want[k], cut[k]) for k in want)


def _refused(capsys, target, out, *extra) -> str:
    capsys.readouterr()
    assert distill(target, out, *extra) == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("extra,message", [
    (("--ttt-steps", "2"), "--ttt-steps: not an option of --method draft"),
    (("--method", "eagle3", "--layers", "2", "--train-embeddings"),
     "--layers, --train-embeddings: not an option of --method eagle3"),
    (("--method", "eagle3", "--draft-vocab", "5000"), "--draft-vocab 5000: must be within 1..4096"),
    (("--method", "eagle3", "--ttt-steps", "0"), "--ttt-steps 0: must be within 1..16"),
    (("--method", "eagle3", "--aux-layers", "1,2"), "--aux-layers 1,2: EAGLE-3 fuses three"),
    (("--method", "eagle3", "--aux-layers", "0,1,4"), "--aux-layers 0,1,4: the target has "
                                                      "layers 0..3"),
    (("--method", "eagle3", "--aux-layers", "a,b,c"), "--aux-layers a,b,c: expected three"),
])
def test_bad_options_are_refused_by_name(capsys, target, tmp_path, extra, message):
    assert message in _refused(capsys, target, tmp_path / "o", *extra)
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def served(pair_dir, tmp_path_factory):
    """The helper's trained head, served beside its target as the server does."""
    head_dir = trained_head_dir(pair_dir[0], tmp_path_factory.mktemp("head") / "head")
    model = load_model(pair_dir[0], torch.float32, CPU)
    head = load_head(head_dir, model, torch.float32, CPU)
    engine = Engine(model, 8, 128, CPU, head=HeadDrafter(head))
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (3, 9, 17, 30)]
    conts = measure.continuations(engine, prompts, 24)
    return engine, prompts, conts, measure.head_runs(engine, prompts, conts, max_k=6)


@pytest.mark.parametrize("k", [1, 4, 6])
def test_the_measurement_replays_the_served_loop(served, k):
    """Per K, the rounds, drafted and accepted tokens of the replay are those of loop.speculate
    drafting with the head (proposer "eagle"), as the server counts them."""
    engine, prompts, conts, runs = served
    chunks = {i: [] for i in range(len(prompts))}

    async def run():
        return await asyncio.gather(*(speculate(
            i, Request(p, len(conts[0]), k, proposer="eagle", prefill_alone=True), None,
            LocalVerifier(engine), engine.max_len, chunks[i].append,
            in_target=tuple(engine.drafters))
            for i, p in enumerate(prompts)))

    stats = asyncio.run(run())
    assert [[t for c in chunks[i] for t in c.tokens] for i in chunks] == conts
    got = measure.acceptance(runs, max_k=6)["per_k"][k]
    assert got["rounds"] == sum(s.rounds for s in stats)
    assert got["drafted"] == sum(s.total_draft_tokens for s in stats)
    accepted = sum(s.total_accepted_draft_tokens for s in stats)
    assert got["a"] == round(accepted / got["drafted"], 4)
    assert got["accepted_per_round"] == round(accepted / got["rounds"], 3)
    assert 0 < accepted < got["drafted"]
    # trained: right often at the first position (the noisy draft of pair_dir: 0.04), not always
    assert 0.2 < measure.acceptance(runs, max_k=6)["acceptance_by_position"][0] < 1


def test_head_cost_ratio(served):
    engine, prompts, _, _ = served
    assert 0 < measure.head_cost_ratio(engine, prompts[1], k=3, repeats=3) < 10


def test_the_committed_test_head_serves_only_the_weights_it_was_trained_for(pair_dir, tmp_path):
    """tests/fixtures/eagle3_head saves the tests a minute and a half of training; a target of
    other weights (another torch or transformers) trains its own, saying so."""
    from tests.core import eagle_helpers
    from tests.tiny_checkpoints import make_checkpoint
    assert eagle_helpers._fixture_fits(pair_dir[0], eagle_helpers.STEPS, 0)
    assert not eagle_helpers._fixture_fits(pair_dir[0], 25, 0)
    other = make_checkpoint(tmp_path / "other", "llama3_gqa_tied", seed=1)
    with pytest.warns(UserWarning, match="trained for other weights"):
        assert not eagle_helpers._fixture_fits(other, eagle_helpers.STEPS, 0)
