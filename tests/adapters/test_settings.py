"""specdec.serving.settings: config.pbtxt parameters, $SPECDEC_* overrides, errors that name them."""
import pytest
import torch

from specdec.serving.engine_settings import EngineSettings
from specdec.serving.settings import (DEFAULT_DRAFT, DEFAULT_TARGET, OrchestratorSettings,
                                      SettingsError, tokenizer_path)


def params(**values):
    """config.pbtxt parameters as Triton hands them to the backend (model_config JSON)."""
    return {k: {"string_value": v} for k, v in values.items()}


def test_orchestrator_defaults_and_empty_parameters():
    s = OrchestratorSettings.parse(params(max_seq_len="", queue_timeout_s=""))
    assert s == OrchestratorSettings(target_model_path=str(DEFAULT_TARGET),
                                     draft_model_path=str(DEFAULT_DRAFT))


def test_orchestrator_parameters_are_typed():
    s = OrchestratorSettings.parse(params(
        target_model_path="/m/t", max_seq_len="256", max_sequences="3", max_tokens_limit="100",
        default_max_tokens="10", max_draft_tokens="6", default_num_draft_tokens="2",
        queue_timeout_s="0.5"))
    assert s == OrchestratorSettings("/m/t", 256, 3, 100, 10, 6, 2, 0.5,
                                     draft_model_path=str(DEFAULT_DRAFT))
    assert isinstance(s.queue_timeout_s, float) and isinstance(s.max_seq_len, int)


def test_plain_string_parameters_are_accepted_too():
    assert OrchestratorSettings.parse({"max_seq_len": "128"}).max_seq_len == 128


def test_environment_wins_over_config(monkeypatch):
    monkeypatch.setenv("SPECDEC_MAX_SEQ_LEN", "512")
    monkeypatch.setenv("SPECDEC_QUEUE_TIMEOUT_S", "2.5")
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", "/env/target")
    s = OrchestratorSettings.parse(params(max_seq_len="128", queue_timeout_s="30",
                                          target_model_path="/cfg/target", max_sequences="5"))
    assert (s.max_seq_len, s.queue_timeout_s, s.target_model_path) == (512, 2.5, "/env/target")
    assert s.max_sequences == 5   # not overridden: the parameter stands


def test_empty_environment_variable_does_not_override(monkeypatch):
    monkeypatch.setenv("SPECDEC_MAX_SEQ_LEN", "")
    assert OrchestratorSettings.parse(params(max_seq_len="128")).max_seq_len == 128


def test_bad_number_in_environment_names_the_variable(monkeypatch):
    monkeypatch.setenv("SPECDEC_MAX_SEQUENCES", "many")
    with pytest.raises(SettingsError) as e:
        OrchestratorSettings.parse(params(max_sequences="4"))
    assert "$SPECDEC_MAX_SEQUENCES" in str(e.value) and "'many'" in str(e.value)
    assert "int" in str(e.value)


@pytest.mark.parametrize("name,value", [("max_seq_len", "1.5"), ("queue_timeout_s", "soon"),
                                        ("max_draft_tokens", "eight")])
def test_bad_number_in_config_names_the_parameter(name, value):
    with pytest.raises(SettingsError) as e:
        OrchestratorSettings.parse(params(**{name: value}))
    assert f"config.pbtxt parameter {name!r}" in str(e.value) and repr(value) in str(e.value)


def test_engine_bad_number_names_the_parameter_or_variable(monkeypatch):
    with pytest.raises(SettingsError, match=r"config.pbtxt parameter 'max_sequences': 'x'"):
        EngineSettings.parse(params(max_sequences="x"), "draft")
    monkeypatch.setenv("SPECDEC_MAX_SEQ_LEN", "1e3")
    with pytest.raises(SettingsError, match=r"\$SPECDEC_MAX_SEQ_LEN: '1e3'"):
        EngineSettings.parse(params(), "target")


@pytest.mark.parametrize("values,message", [
    (dict(default_num_draft_tokens="9", max_draft_tokens="8"), "default_num_draft_tokens"),
    (dict(default_num_draft_tokens="-2"), "default_num_draft_tokens"),
    (dict(spec_full_below="8"), "spec_full_below"),
    (dict(draft_timeout_s="0"), "draft_timeout_s"),
    (dict(default_max_tokens="0"), "default_max_tokens"),
    (dict(default_max_tokens="65", max_tokens_limit="64"), "default_max_tokens"),
])
def test_orchestrator_inconsistent_defaults(values, message):
    with pytest.raises(SettingsError, match=message):
        OrchestratorSettings.parse(params(**values))


# --- draft_model / target_model

def test_engine_defaults_per_role():
    t = EngineSettings.parse({}, "target")
    d = EngineSettings.parse({}, "draft")
    assert (t.model_path, t.target_model_path) == (str(DEFAULT_TARGET), str(DEFAULT_TARGET))
    assert (d.model_path, d.target_model_path) == (str(DEFAULT_DRAFT), str(DEFAULT_TARGET))
    assert (t.max_sequences, t.max_seq_len, t.dtype, t.device) == (16, 1024, "auto", "auto")


def test_engine_config_paths():
    d = EngineSettings.parse(params(model_path="/cfg/draft", target_model_path="/cfg/target",
                                    max_sequences="2", max_seq_len="64", dtype="float16",
                                    device="cpu"), "draft")
    assert d == EngineSettings("/cfg/draft", "/cfg/target", 2, 64, "float16", "cpu",
                               tokenizer_path="/cfg/target")
    t = EngineSettings.parse(params(model_path="/cfg/target"), "target")
    assert (t.model_path, t.target_model_path) == ("/cfg/target", "/cfg/target")


def test_role_specific_environment_paths(monkeypatch):
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", "/env/target")
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", "/env/draft")
    cfg = params(model_path="/cfg/model", target_model_path="/cfg/target")
    d = EngineSettings.parse(cfg, "draft")
    t = EngineSettings.parse(cfg, "target")
    assert (d.model_path, d.target_model_path) == ("/env/draft", "/env/target")
    assert (t.model_path, t.target_model_path) == ("/env/target", "/env/target")
    # $SPECDEC_MODEL_PATH is not a thing: the path variables are per role.
    monkeypatch.delenv("SPECDEC_DRAFT_MODEL")
    monkeypatch.setenv("SPECDEC_MODEL_PATH", "/env/generic")
    assert EngineSettings.parse(cfg, "draft").model_path == "/cfg/model"


def test_draft_env_does_not_move_the_target(monkeypatch):
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", "/env/draft")
    t = EngineSettings.parse(params(model_path="/cfg/target"), "target")
    d = EngineSettings.parse({}, "draft")
    assert t.model_path == "/cfg/target"
    assert (d.model_path, d.target_model_path) == ("/env/draft", str(DEFAULT_TARGET))


def test_shared_engine_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("SPECDEC_MAX_SEQ_LEN", "333")
    monkeypatch.setenv("SPECDEC_DEVICE", "cpu")
    monkeypatch.setenv("SPECDEC_DTYPE", "bfloat16")
    for role in ("draft", "target"):
        s = EngineSettings.parse(params(max_seq_len="64", device="cuda", dtype="float32"), role)
        assert (s.max_seq_len, s.device, s.dtype) == (333, "cpu", "bfloat16")
        assert s.torch_device() == torch.device("cpu") and s.torch_dtype() == torch.bfloat16


@pytest.mark.parametrize("values,message", [
    (dict(dtype="fp8"), "dtype 'fp8'"),
    (dict(max_sequences="0"), "max_sequences"),
    (dict(max_seq_len="1"), "max_seq_len"),
])
def test_engine_invalid_values(values, message):
    with pytest.raises(SettingsError, match=message):
        EngineSettings.parse(params(**values), "target")


def test_engine_auto_dtype_on_cpu():
    s = EngineSettings.parse(params(device="cpu"), "draft")
    assert s.torch_device() == torch.device("cpu") and s.torch_dtype() == torch.float32
    assert EngineSettings.parse(params(dtype="float64"), "draft").torch_dtype() == torch.float64


# --- preprocessing / postprocessing

def test_tokenizer_path_fallback_order(monkeypatch):
    full = params(tokenizer_path="/cfg/tok", target_model_path="/cfg/target")
    monkeypatch.setenv("SPECDEC_TOKENIZER", "/env/tok")
    monkeypatch.setenv("SPECDEC_TARGET_MODEL", "/env/target")
    assert tokenizer_path(full) == "/env/tok"                       # 1. $SPECDEC_TOKENIZER
    monkeypatch.delenv("SPECDEC_TOKENIZER")
    assert tokenizer_path(full) == "/cfg/tok"                       # 2. tokenizer_path
    assert tokenizer_path(params(tokenizer_path="", target_model_path="/cfg/target")) \
        == "/env/target"                                            # 3. $SPECDEC_TARGET_MODEL
    monkeypatch.delenv("SPECDEC_TARGET_MODEL")
    assert tokenizer_path(params(tokenizer_path="", target_model_path="/cfg/target")) \
        == "/cfg/target"                                            # 4. target_model_path
    assert tokenizer_path(params(tokenizer_path="")) == str(DEFAULT_TARGET)   # 5. default


def test_attention_and_cuda_graphs(monkeypatch):
    t = EngineSettings.parse({}, "target")
    assert (t.attention, t.cuda_graphs) == ("auto", True)
    t = EngineSettings.parse(params(attention="sdpa", cuda_graphs="off"), "target")
    assert (t.attention, t.cuda_graphs) == ("sdpa", False)
    monkeypatch.setenv("SPECDEC_CUDA_GRAPHS", "no")
    assert EngineSettings.parse(params(cuda_graphs="true"), "draft").cuda_graphs is False
    monkeypatch.setenv("SPECDEC_CUDA_GRAPHS", "maybe")
    with pytest.raises(SettingsError, match=r"\$SPECDEC_CUDA_GRAPHS: 'maybe' is not a valid bool"):
        EngineSettings.parse({}, "draft")
    monkeypatch.delenv("SPECDEC_CUDA_GRAPHS")
    with pytest.raises(SettingsError, match="attention 'xformers': expected auto, sdpa or flash"):
        EngineSettings.parse(params(attention="xformers"), "target")


@pytest.mark.parametrize("values,message", [
    (dict(default_proposer="lookup"), "default_proposer 'lookup'"),
    (dict(draft_model_path="none", default_proposer="draft"), "needs a draft model"),
    (dict(default_proposer="eagle"), "needs an EAGLE-3 head, and .SPECDEC_EAGLE_HEAD is not set"),
    (dict(ngram_min_n="3", ngram_max_n="2"), "ngram_min_n"),
])
def test_proposer_settings_are_checked(values, message):
    with pytest.raises(SettingsError, match=message):
        OrchestratorSettings.parse(params(**values))


def test_max_prefill_tokens(monkeypatch):
    """auto is 128 prompt tokens a batch where no GPU is seen, no limit where one is; 0 is no
    limit; below -1 is refused at load."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert OrchestratorSettings.parse(params()).prefill_budget() == 128
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert OrchestratorSettings.parse(params()).prefill_budget() is None
    assert OrchestratorSettings.parse(params(max_prefill_tokens="0")).prefill_budget() is None
    monkeypatch.setenv("SPECDEC_MAX_PREFILL_TOKENS", "64")
    assert OrchestratorSettings.parse(params()).prefill_budget() == 64
    monkeypatch.setenv("SPECDEC_MAX_PREFILL_TOKENS", "-2")
    with pytest.raises(SettingsError, match="max_prefill_tokens -2: expected -1"):
        OrchestratorSettings.parse(params())


def test_no_draft_model(monkeypatch):
    monkeypatch.setenv("SPECDEC_DRAFT_MODEL", "none")
    s = OrchestratorSettings.parse(params())
    assert not s.has_draft and s.proposer == "ngram"
    assert EngineSettings.parse(params(), "draft").disabled
    with pytest.raises(SettingsError, match="target model cannot be 'none'"):
        monkeypatch.setenv("SPECDEC_TARGET_MODEL", "none")
        EngineSettings.parse(params(), "target")
