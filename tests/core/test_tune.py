"""`specdec tune`: refusals that name what is wrong, and a whole run on a small real-format pair."""
import json
import shutil
from pathlib import Path

import pytest

from specdec.cli import main
from specdec.tune.report import predicted_speedup
from tests.tiny_checkpoints import make_checkpoint, make_draft

ROOT_TOKENIZER = "models/default/target"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# The embedded target and the EAGLE-3 head shipped for it (`specdec distill --method eagle3`):
# the head tests need one that accepts some drafts, and training one here cost a minute of CI.
DEFAULT = Path(__file__).resolve().parents[2] / "models" / "default"
DEFAULT_TARGET, DEFAULT_HEAD = str(DEFAULT / "target"), str(DEFAULT / "eagle")


def with_tokenizer(path, src=ROOT_TOKENIZER):
    for name in TOKENIZER_FILES:
        shutil.copy2(Path(__file__).resolve().parents[2] / src / name, path / name)
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """vocab 4096 with the default pair's real BPE tokenizer, GQA and tied embeddings."""
    root = tmp_path_factory.mktemp("tune")
    target = with_tokenizer(make_checkpoint(root / "t", "llama3_gqa_tied", vocab_size=4096))
    return target, with_tokenizer(make_draft(target, root / "d", noise=0.3))


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": p}) for p in
                           ["def main():\n", "import os\nimport sys\n", "class Queue:\n"]))
    return f


def tune(*args):
    return main(["tune", "--quiet", *map(str, args)])


def test_a_run_measures_every_k_and_picks_the_fastest(pair, prompts, tmp_path, capsys):
    out = tmp_path / "tune.json"
    assert tune("--target", pair[0], "--draft", pair[1], "--prompts", prompts, "--ks", "1,3",
                "--max-tokens", 12, "--out", out) == 0
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [r["k"] for r in rows] == [0, 1, 3]
    assert all(r["same_output_as_target_only"] == 3 for r in rows)     # greedy: exact at any K
    assert report["best_k"] == max(rows, key=lambda r: r["speedup"])["k"]
    assert 0 < report["acceptance_by_position"][0] < 1
    assert isinstance(report["speculate"], bool) and report["verdict"]
    printed = capsys.readouterr().out
    assert "| K | tok/s |" in printed and "Verdict:" in printed


@pytest.mark.parametrize("case,message", [
    ("missing", "model directory does not exist"),
    ("tokenizer", "the draft's tokenizer differs from the target's"),
    ("vocab", "vocab_size 97 differs from the target's 4096"),
    ("empty", "no prompts (empty file)"),
    ("unreadable", "cannot be read"),
    ("bad_json", "not JSON"),
    ("ks", "--ks"),
])
def test_bad_input_is_refused_by_name(pair, prompts, tmp_path, capsys, case, message):
    target, draft = pair
    args = ["--target", target, "--draft", draft, "--prompts", prompts]
    if case == "missing":
        args[3] = tmp_path / "nowhere"
    elif case == "tokenizer":
        other = tmp_path / "other"
        shutil.copytree(draft, other)
        tok = json.loads((other / "tokenizer.json").read_text())
        vocab = tok["model"]["vocab"]
        a, b = list(vocab)[100:102]
        vocab[a], vocab[b] = vocab[b], vocab[a]
        (other / "tokenizer.json").write_text(json.dumps(tok))
        args[3] = other
    elif case == "vocab":
        args[3] = make_checkpoint(tmp_path / "small", "llama2")     # no tokenizer, vocab 97
    elif case == "empty":
        args[5] = tmp_path / "empty.txt"
        args[5].write_text("\n\n")
    elif case == "unreadable":
        args[5] = tmp_path / "binary.txt"
        args[5].write_bytes(b"\xff\xfe\x00prompt")
    elif case == "bad_json":
        args[5] = tmp_path / "bad.jsonl"
        args[5].write_text('{"prompt": "a"}\n{"prompt": \n')
    elif case == "ks":
        args += ["--ks", "0,2"]
    assert tune(*args) == 2
    err = capsys.readouterr().err
    assert message in err, err
    if case in ("missing", "tokenizer", "vocab"):
        assert str(args[3]) in err
    if case in ("empty", "unreadable", "bad_json"):
        assert str(args[5]) in err


def test_predicted_speedup_is_the_policys_model():
    free = {"draft": (0.0, 0.0), "verify": (1.0, 0.0), "other": (0.0, 0.0)}
    assert predicted_speedup(4, [1.0] * 4, free) == pytest.approx(5.0)
    assert predicted_speedup(4, [0.0] * 4, free) == pytest.approx(1.0)
    costly = {"draft": (0.5, 0.25), "verify": (1.0, 0.0), "other": (0.0, 0.0)}
    assert predicted_speedup(2, [1.0, 1.0], costly) == pytest.approx(3 / 2.0)


def test_a_head_is_tuned_like_a_draft(prompts, tmp_path, capsys):
    """--eagle-head: the same K table with the head drafting inside the target's verification
    (the output exact at every K), its acceptance by position, the best K."""
    out = tmp_path / "tune.json"
    assert tune("--target", DEFAULT_TARGET, "--eagle-head", DEFAULT_HEAD, "--prompts", prompts,
                "--ks", "1,3", "--max-tokens", 12, "--out", out) == 0
    report = json.loads(out.read_text())
    assert report["proposer"] == "eagle" and report["eagle_head"] == DEFAULT_HEAD
    assert report["draft"] is None
    rows = report["rows"]
    assert [r["k"] for r in rows] == [0, 1, 3]
    assert all(r["same_output_as_target_only"] == 3 for r in rows)
    assert rows[1]["acceptance"] > 0 and rows[1]["c"] > 0, rows
    assert report["acceptance_by_position"][0] > 0
    assert "the EAGLE-3 head eagle" in capsys.readouterr().out


def test_a_head_that_does_not_fit_the_target_is_refused_by_name(prompts, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(DEFAULT_HEAD, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["transformer_layer_config"]["hidden_size"] *= 2
    cfg["target_hidden_size"] *= 2
    (other / "config.json").write_text(json.dumps(cfg))
    assert tune("--target", DEFAULT_TARGET, "--eagle-head", other, "--prompts", prompts) == 2
    err = capsys.readouterr().err
    assert str(other) in err and "hidden_size" in err, err
