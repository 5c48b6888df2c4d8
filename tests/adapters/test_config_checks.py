"""Load-time refusals across models and checkpoints (specdec/serving/checks.py, the draft's
tokenizer, the EAGLE-3 head's target), and which draft a deployment gets. Each refusal must name
the field and both values."""
import json
import shutil
from pathlib import Path

import pytest

from specdec.runtime.config import CheckpointError
from specdec.proposers.eagle.checkpoint import check_verifier
from specdec.serving import checks
from specdec.serving.engine_model import DraftModel, TargetModel
from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import (DEFAULT_DRAFT, DEFAULT_TARGET, NO_DRAFT,
                                      OrchestratorSettings, SettingsError, model_paths)
from specdec.serving.tokenizer import TokenizerMismatch, check_draft_tokenizer, special_ids
from tests.adapters import fake_pb
from tests.adapters.conftest import engine_config, load_triton_model

REPOSITORY = fake_pb.MODEL_REPOSITORY
SETTINGS_OF = {"draft_model": EngineSettings, "target_model": EngineSettings,
               "speculative_decoding": OrchestratorSettings}


# --- which draft a deployment gets

def test_user_target_without_user_draft_gets_no_toy_draft(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", str(tmp_path / "llama"))
    paths = model_paths({})
    assert paths.draft == NO_DRAFT and "$SPECDEC_DRAFT_MODEL is unset" in paths.draft_reason
    s = OrchestratorSettings.parse({})
    assert not s.has_draft and s.proposers == ("ngram", "suffix") and s.proposer == "ngram"
    assert EngineSettings.parse({}, "draft").disabled
    line = s.start_line()
    assert line.startswith("proposers ngram, suffix (no draft model; prompt lookup;")
    assert str(tmp_path / "llama") in line and "toy draft serves only the default target" in line
    monkeypatch.setenv("SPECDEC_EAGLE_HEAD", str(tmp_path / "head"))
    s = OrchestratorSettings.parse({})
    assert s.proposers == ("ngram", "suffix", "eagle") and s.proposer == "eagle"
    assert f"EAGLE-3 head {tmp_path / 'head'}" in s.start_line()


def test_user_draft_and_default_target_keep_a_draft(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", str(tmp_path / "llama"))
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", str(tmp_path / "small"))
    assert model_paths({}).draft == str(tmp_path / "small")
    assert OrchestratorSettings.parse({}).proposers == ("draft", "ngram", "suffix")
    # The default target named explicitly (as the image does) keeps the default draft.
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", str(DEFAULT_TARGET) + "/")
    monkeypatch.delenv("SPECDEC_DRAFT_MODEL")
    assert model_paths({}).draft == str(DEFAULT_DRAFT)


def test_default_pair_location_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_DEFAULT_MODELS", str(tmp_path))
    p = model_paths({})
    assert (p.target, p.draft, p.tokenizer) == (str(tmp_path / "target"), str(tmp_path / "draft"),
                                                str(tmp_path / "target"))
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", str(tmp_path / "target"))
    assert model_paths({}).draft == str(tmp_path / "draft")


def test_speculative_decoding_logs_its_proposers_at_load(checkpoints, monkeypatch, capsys):
    target, _ = checkpoints
    for name, value in {"SPECDEC_TARGET_MODEL": target, "SPECDEC_MAX_SEQ_LEN": "64",
                        "SPECDEC_MAX_SEQUENCES": "3"}.items():
        monkeypatch.setenv(name, value)
    model = load_triton_model("speculative_decoding", monkeypatch).TritonPythonModel()
    model.initialize(fake_pb.ModelConfig("speculative_decoding").args())
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "proposers" in ln]
    assert len(lines) == 1
    assert lines[0].startswith("specdec speculative_decoding: proposers ngram, suffix (no draft model")
    assert not model.orchestrator.settings.has_draft
    # The streamed windows reach past the tokenizer's special ids (detokenize.window).
    assert model.orchestrator.special == special_ids(target) and len(special_ids(target)) == 2


# --- config.pbtxt: what each file carries

@pytest.mark.parametrize("model", sorted(p.parent.name for p in REPOSITORY.glob("*/config.pbtxt")))
def test_config_parameters_are_read_by_their_model(model):
    """No parameter a model ignores, and no checkpoint path: those come from the environment."""
    params = set(checks.read_model_config(REPOSITORY / model / "config.pbtxt").get("parameters",
                                                                                 {}))
    assert not params & {"model_path", "target_model_path", "draft_model_path",
                         "eagle_head_path", "tokenizer_path"}
    cls = SETTINGS_OF.get(model)
    if cls is not None:
        assert params <= {f.name for f in cls.__dataclass_fields__.values()}


def test_shipped_configs_agree_and_run_one_instance():
    s = OrchestratorSettings.parse(checks.read_model_config(
        REPOSITORY / "speculative_decoding" / "config.pbtxt")["parameters"])
    checks.check_shared_sizes(s, REPOSITORY)
    for model in checks.STATEFUL:
        assert checks.instance_count(checks.read_model_config(
            REPOSITORY / model / "config.pbtxt")) == 1


# --- max_seq_len / max_sequences agree between models

def edited_repository(tmp_path, model, name, value) -> Path:
    repo = tmp_path / "repo"
    shutil.copytree(REPOSITORY, repo, ignore=shutil.ignore_patterns("__pycache__"))
    file = repo / model / "config.pbtxt"
    text = file.read_text()
    old = next(ln for ln in text.splitlines() if f'key: "{name}"' in ln)
    file.write_text(text.replace(old, f'parameters: {{ key: "{name}" value: {{ string_value: '
                                      f'"{value}" }} }}'))
    return repo


@pytest.mark.parametrize("model,name,value", [("target_model", "max_seq_len", "512"),
                                              ("draft_model", "max_sequences", "4")])
def test_mismatched_sizes_are_refused_naming_both_values(tmp_path, model, name, value):
    repo = edited_repository(tmp_path, model, name, value)
    s = OrchestratorSettings.parse({})
    with pytest.raises(SettingsError) as e:
        checks.check_shared_sizes(s, repo)
    ours = str(getattr(s, name))
    assert str(e.value).startswith(f"{name}: speculative_decoding has {ours}, {model} has {value}")
    assert ours != value


def test_environment_sets_the_shared_sizes_for_all(tmp_path, monkeypatch):
    repo = edited_repository(tmp_path, "target_model", "max_seq_len", "512")
    monkeypatch.setenv("SPECDEC_MAX_SEQ_LEN", "256")
    checks.check_shared_sizes(OrchestratorSettings.parse({}), repo)


def test_a_disabled_draft_model_is_not_compared(tmp_path, monkeypatch):
    repo = edited_repository(tmp_path, "draft_model", "max_seq_len", "16")
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", "none")
    checks.check_shared_sizes(OrchestratorSettings.parse({}), repo)


def test_speculative_decoding_refuses_to_load_beside_a_mismatched_model(
        checkpoints, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", checkpoints[0])
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", checkpoints[1])
    module = load_triton_model("speculative_decoding", monkeypatch)
    module.REPOSITORY = edited_repository(tmp_path, "target_model", "max_sequences", "2")
    with pytest.raises(SettingsError, match="max_sequences: speculative_decoding has 16, "
                                            "target_model has 2"):
        module.TritonPythonModel().initialize(fake_pb.ModelConfig("speculative_decoding").args())


# --- one instance of a stateful model

@pytest.mark.parametrize("group,n", [({"count": 2, "kind": "KIND_MODEL"}, 2),
                                     ({"count": 1, "kind": "KIND_GPU", "gpus": [0, 1]}, 2),
                                     ({"count": 3, "kind": "KIND_CPU"}, 3)])
@pytest.mark.parametrize("cls", [DraftModel, TargetModel])
def test_more_than_one_instance_is_refused(checkpoints, cls, group, n):
    config = {**engine_config(checkpoints, cls.role), "instance_group": [group]}
    with pytest.raises(SettingsError) as e:
        cls(fake_pb, config)
    assert str(e.value).startswith(f"{cls.role}_model: instance_group count gives {n} "
                                   f"instances, must be 1")


def test_the_model_file_refuses_two_instances(checkpoints, monkeypatch):
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", checkpoints[0])
    config = fake_pb.ModelConfig("target_model")
    args = config.args()
    args["model_config"] = json.dumps({**json.loads(args["model_config"]),
                                       "instance_group": [{"count": 2, "kind": "KIND_CPU"}]})
    model = load_triton_model("target_model", monkeypatch).TritonPythonModel()
    with pytest.raises(SettingsError, match="target_model: instance_group count gives 2"):
        model.initialize(args)


# --- the draft's tokenizer maps ids as the target's

def permuted(tokenizer_dir: Path, out: Path) -> tuple[str, int, int]:
    """A copy of the tokenizer at `tokenizer_dir` with two tokens' ids swapped: (one of the
    tokens, its id there, its id in the copy)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy2(f, out / f.name)
    data = json.loads((out / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    special = {t["content"] for t in data.get("added_tokens", [])}
    a, b = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1]) if t not in special][40:42]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (out / "tokenizer.json").write_text(json.dumps(data))
    return a, vocab[b], vocab[a]


def draft_with_tokenizer(checkpoints, tmp_path, tokenizer_from: Path | None, permute: bool):
    draft = tmp_path / "draft"
    shutil.copytree(checkpoints[1], draft)
    if tokenizer_from is not None and permute:
        return draft, permuted(tokenizer_from, draft)
    if tokenizer_from is not None:
        for f in tokenizer_from.iterdir():
            if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
                shutil.copy2(f, draft / f.name)
    return draft, None


def draft_config(checkpoints, draft: Path) -> dict:
    config = engine_config(checkpoints, "draft")
    config["parameters"]["draft_model_path"] = {"string_value": str(draft)}
    return config


def test_draft_with_the_targets_tokenizer_loads(checkpoints, tmp_path, capsys):
    draft, _ = draft_with_tokenizer(checkpoints, tmp_path, Path(checkpoints[0]), permute=False)
    assert DraftModel(fake_pb, draft_config(checkpoints, draft)).engine is not None
    assert f"draft tokenizer {draft}: the same vocabulary" in capsys.readouterr().err


def test_draft_with_a_permuted_tokenizer_is_refused(checkpoints, tmp_path):
    draft, (token, target_id, draft_id) = draft_with_tokenizer(
        checkpoints, tmp_path, Path(checkpoints[0]), permute=True)
    with pytest.raises(TokenizerMismatch) as e:
        DraftModel(fake_pb, draft_config(checkpoints, draft))
    message = str(e.value)
    assert "maps tokens to ids differently" in message and "2 tokens differ" in message
    assert f"{token!r}: id {draft_id} in the draft's, id {target_id} in the target's" in message \
        or f": id {target_id} in the draft's, id {draft_id} in the target's" in message


def test_default_pair_tokenizers_agree_and_a_permuted_one_is_refused(tmp_path):
    assert "the same vocabulary" in check_draft_tokenizer(
        str(DEFAULT_DRAFT), str(DEFAULT_TARGET), 1, 1)
    token, ours, theirs = permuted(DEFAULT_TARGET, tmp_path / "tok")
    with pytest.raises(TokenizerMismatch) as e:
        check_draft_tokenizer(str(DEFAULT_DRAFT), str(tmp_path / "tok"), 1, 1)
    assert (f"{token!r}: id {ours} in the draft's, id {theirs} in the target's" in str(e.value)
            or f"id {theirs} in the draft's, id {ours} in the target's" in str(e.value))


def test_a_draft_holding_fewer_tokens_at_the_same_ids_loads(tmp_path):
    out = tmp_path / "tok"
    permuted(DEFAULT_TARGET, out)   # the files, then the target's own vocabulary minus its last
    data = json.loads((DEFAULT_TARGET / "tokenizer.json").read_text())
    last = max(data["model"]["vocab"], key=data["model"]["vocab"].get)
    del data["model"]["vocab"][last]
    data["model"]["merges"] = [m for m in data["model"]["merges"]
                               if last not in ("".join(m) if isinstance(m, list) else
                                               m.replace(" ", ""))]
    (out / "tokenizer.json").write_text(json.dumps(data))
    line = check_draft_tokenizer(str(out), str(DEFAULT_TARGET), 1, 1)
    assert "of the target's" in line and "at the same ids" in line


def test_draft_without_a_tokenizer_is_compared_by_vocab_size(checkpoints, tmp_path):
    draft, _ = draft_with_tokenizer(checkpoints, tmp_path, None, permute=False)
    line = check_draft_tokenizer(str(draft), checkpoints[0], 320, 320)
    assert "no tokenizer files: only vocab_size compared (320 both)" in line
    with pytest.raises(TokenizerMismatch) as e:
        check_draft_tokenizer(str(draft), checkpoints[0], 320, 4096)
    assert "vocab_size 320, the target's 4096" in str(e.value)


# --- an EAGLE-3 head for another target

def head_for(tmp_path, architectures) -> Path:
    head = tmp_path / "head"
    head.mkdir()
    cfg = json.loads((DEFAULT_TARGET.parent / "eagle" / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["architectures"] = architectures
    (head / "config.json").write_text(json.dumps(cfg))
    return head


def test_head_for_another_architecture_is_refused(checkpoints, tmp_path, monkeypatch):
    head = head_for(tmp_path, ["Qwen2ForCausalLM"])
    monkeypatch.setenv("SPECDEC_EAGLE_HEAD", str(head))
    with pytest.raises(CheckpointError) as e:
        TargetModel(fake_pb, engine_config(checkpoints, "target"))
    assert ("speculators_config.verifier.architectures ['Qwen2ForCausalLM'] is not the target's "
            "architectures ['LlamaForCausalLM']") in str(e.value)


def test_head_for_the_same_architecture_passes_the_check(tmp_path):
    line = check_verifier(head_for(tmp_path, ["LlamaForCausalLM"]), DEFAULT_TARGET)
    assert line.endswith("trained for models/default/target")


def test_the_cuda_line_names_the_cudnn_this_process_loaded(monkeypatch):
    """A stub whose cuDNN failed to load serves attention by SDPA's math kernels: the load
    says so in its line."""
    import torch

    from specdec.serving.checks import cuda_line
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    line = cuda_line(torch.device("cuda", 0))
    assert line.startswith("NVIDIA H100 80GB HBM3 (cuda:0), torch ") and "cuDNN 91002" in line
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: False)
    assert cuda_line(torch.device("cuda", 0)).endswith("cuDNN unavailable")
