"""The target's engine in speculative_decoding's process ($SPECDEC_TARGET_PLACEMENT=orchestrator,
serving/hosted.py): the same tokens as over BLS to target_model, no target_model call, per-row
errors as target_model gives them, its slots released; target_model itself loads nothing."""
import json

import pytest

from specdec import names
from specdec.runtime.config import ModelArgs
from specdec.serving.grammar import Grammars
from specdec.records import Round
from specdec.serving.bls import BlsDrafter
from specdec.serving.engine_model import TargetModel
from specdec.serving.hosted import HostedVerifier
from specdec.serving.metrics import Metrics
from specdec.serving.orchestrator import Orchestrator
from specdec.serving.settings import InTargetSettings, OrchestratorSettings, SettingsError
from tests.adapters import fake_pb
from tests.adapters.conftest import MAX_SEQ_LEN, engine_config, orchestrator_request, run_all
from tests.adapters.responses import PROMPTS, assert_one_final, finish_reason, output_ids


def hosted_config(checkpoints, max_sequences: int = 4) -> dict:
    config = engine_config(checkpoints, "target", max_sequences)
    config["parameters"]["target_placement"] = {"string_value": "orchestrator"}
    return config


def hosted_orchestrator(checkpoints, engine_sequences: int = 4, grammars=None, **overrides):
    """An orchestrator holding the target's engine; the draft stays draft_model's, over BLS.
    grammars: with the grammar engine over the target's tokenizer (its eos the target's)."""
    model = TargetModel(fake_pb, hosted_config(checkpoints, engine_sequences), hosted=True)
    params = {"max_seq_len": str(MAX_SEQ_LEN), "max_sequences": "4",
              "target_model_path": checkpoints[0], "draft_placement": "separate",
              "target_placement": "orchestrator", **{k: str(v) for k, v in overrides.items()}}
    settings = OrchestratorSettings.parse(params)
    metrics = Metrics(fake_pb, "speculative_decoding", settings.max_draft_tokens,
                      in_target=settings.in_target, hosted=True)
    args = ModelArgs.from_dir(checkpoints[0])
    eos = tuple(args.eos_token_ids) if grammars else ()
    make = (lambda: Grammars.load(checkpoints[0], args.vocab_size, eos)) if grammars else None
    return Orchestrator(fake_pb, settings, eos, args.vocab_size, BlsDrafter(fake_pb),
                        HostedVerifier(fake_pb, model, on_batch=metrics.target_batch),
                        metrics, grammars=make), model


SCHEMA = json.dumps({"type": "object", "properties": {
    "ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]},
    "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}},
    "required": ["ok", "size", "tags"], "additionalProperties": False})


def test_a_json_schema_holds_the_output_with_speculation_on_and_off(serving, checkpoints,
                                                                   tokenizer):
    """The output parses as the schema says, and is the same whatever drafts (greedy): the
    target's choice within the grammar at every position it verifies."""
    orch, model = hosted_orchestrator(checkpoints, grammars=True)
    texts = []
    for fields in (dict(num_draft_tokens=0), dict(num_draft_tokens=4),
                   dict(num_draft_tokens=4, proposer="ngram"), dict(num_draft_tokens=-1)):
        requests = [orchestrator_request(p, max_tokens=48, json_schema=SCHEMA, stream=True,
                                         **fields) for p in PROMPTS]
        run_all(orch, requests)
        texts.append([tokenizer.decode(output_ids(r), skip_special_tokens=True)
                      for r in requests])
        for r in requests:
            assert_one_final(r)
            assert finish_reason(r.sender.responses()[-1]) == "eos"   # the object closed
    assert all(t == texts[0] for t in texts)
    for text in texts[0]:
        value = json.loads(text)
        assert set(value) == {"ok", "size", "tags"} and isinstance(value["ok"], bool)
        assert value["size"] in ("small", "large") and set(value["tags"]) <= {"a", "b"}
    assert model.engine.pool.active == 0
    # Unconstrained, the same target writes no such object.
    free = [orchestrator_request(p, max_tokens=48) for p in PROMPTS]
    run_all(orch, free)
    assert not any(tokenizer.decode(output_ids(r)).startswith("{") for r in free)


def test_a_bad_schema_or_one_over_bls_is_refused_naming_json_schema(serving, checkpoints):
    orch, _ = hosted_orchestrator(checkpoints, grammars=True)
    over_bls = serving.orchestrator()
    for o, schema, says in ((orch, "{not json", ""), (orch, '{"type": "nonsense"}', ""),
                            (over_bls, SCHEMA, "in this process")):
        bad, good = (orchestrator_request(PROMPTS[0], max_tokens=4, json_schema=schema),
                     orchestrator_request(PROMPTS[0], max_tokens=4))
        run_all(o, [bad, good])
        (resp,) = bad.sender.responses()
        assert resp.has_error() and resp.error().code() == fake_pb.TritonError.INVALID_ARG
        assert resp.error().message().startswith("json_schema:") and says in \
            resp.error().message()
        assert len(output_ids(good)) == 4


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_hosted_gives_what_target_model_gives_without_calling_it(serving, checkpoints,
                                                                  temperature):
    """Greedy and seeded sampling (the draft's q crosses from draft_model's response into the
    hosted engine), four sequences at once: token for token what the BLS verifier serves."""
    fields = dict(max_tokens=20, temperature=temperature, seed=77, num_draft_tokens=3,
                  stream=True)
    over_bls = [orchestrator_request(p, **fields) for p in PROMPTS]
    run_all(serving.orchestrator(), over_bls)
    calls_before = len(serving.target_bls.batches)
    orch, model = hosted_orchestrator(checkpoints)
    hosted = [orchestrator_request(p, **fields) for p in PROMPTS]
    run_all(orch, hosted)
    for a, b in zip(over_bls, hosted):
        assert_one_final(b)
        assert output_ids(b) == output_ids(a) and len(output_ids(b)) == 20
        last = b.sender.responses()[-1]
        assert int(fake_pb.get_output_tensor_by_name(last, names.TOTAL_DRAFT_TOKENS)
                   .as_numpy()[0]) > 0
    assert len(serving.target_bls.batches) == calls_before   # target_model was not called
    assert model.engine.pool.active == 0 and serving.draft.engine.pool.active == 0
    # Both placements count the verifications (rows) each target call carried: the same rows,
    # four sequences' rounds batched (32-36 calls for 69-71 rows here), but over BLS a sampled
    # round whose q comes from draft_model travels alone (65 calls).
    for metrics in (serving.metrics, orch.metrics):
        metrics.flush()
    counts = {name: [m.value() for m in fake_pb.metrics(name, model="speculative_decoding")]
              for name in ("specdec_target_batches_total", "specdec_target_batch_rows_total")}
    (bls_calls, hosted_calls), (bls_rows, hosted_rows) = counts.values()
    assert hosted_rows == bls_rows > 20 and 1.5 * hosted_calls < hosted_rows
    if temperature == 0.0:
        assert 1.5 * bls_calls < bls_rows
    else:
        assert bls_calls > 1.5 * hosted_calls
    # The hosted engine's slots show as target_model's, as target_model shows them.
    assert model.slots_used.labels == {"model": "target_model"}
    assert max(model.slots_used.history) == 4 and model.slots_used.history[-1] == 0


def test_a_full_hosted_target_refuses_one_request_with_unavailable(serving, checkpoints):
    orch, model = hosted_orchestrator(checkpoints, engine_sequences=1, max_sequences=2)
    a, b = (orchestrator_request(p, max_tokens=6) for p in PROMPTS[:2])
    run_all(orch, [a, b])
    errors = [r.sender.responses()[0] for r in (a, b) if r.sender.responses()[0].has_error()]
    assert len(errors) == 1
    assert errors[0].error().code() == fake_pb.TritonError.UNAVAILABLE
    assert errors[0].error().message().startswith("target_model:")
    assert model.engine.pool.active == 0


def test_the_hosting_process_runs_target_models_fault_script(checkpoints, monkeypatch,
                                                              tmp_path):
    """$SPECDEC_TARGET_FAULT scripts the process that holds the engine, even where target_model
    (loading nothing) starts first: a script runs in the first process that claims it."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))   # this test's claim markers
    monkeypatch.setenv("SPECDEC_TARGET_FAULT", "unavailable*1")
    TargetModel(fake_pb, hosted_config(checkpoints))
    orch, model = hosted_orchestrator(checkpoints)
    first, second = (orchestrator_request(p, max_tokens=6) for p in PROMPTS[:2])
    run_all(orch, [first])
    run_all(orch, [second])
    [failed] = first.sender.responses()
    assert failed.error().code() == fake_pb.TritonError.UNAVAILABLE
    assert "target_model: " in failed.error().message()
    assert "injected fault" in failed.error().message()
    assert len(output_ids(second)) == 6 and model.engine.pool.active == 0


def test_target_model_loads_nothing_and_refuses_calls_when_hosted_elsewhere(checkpoints):
    model = TargetModel(fake_pb, hosted_config(checkpoints))
    assert model.engine is None
    [response] = model.execute([fake_pb.InferenceRequest("target_model", [], [])])
    assert response.error().code() == fake_pb.TritonError.INVALID_ARG
    assert "$SPECDEC_TARGET_PLACEMENT" in response.error().message()


def test_hosted_rounds_count_no_target_call():
    m = Metrics(fake_pb, "hosted_test", max_draft_tokens=8, in_target=(), hosted=True)
    for proposer in ("draft", "ngram"):
        m.round(Round(k=3, accepted=1, draft_s=0.001, verify_s=0.01, proposer=proposer))
    m.flush()
    (draft,) = fake_pb.metrics("specdec_bls_calls_per_round", model="hosted_test",
                               proposer="draft")
    (lookup,) = fake_pb.metrics("specdec_bls_calls_per_round", model="hosted_test",
                                proposer="ngram")
    assert (draft.value(), lookup.value()) == (1.0, 0.0)


def test_a_bad_target_placement_is_refused_by_name(monkeypatch):
    monkeypatch.setenv("SPECDEC_TARGET_PLACEMENT", "gpu")
    with pytest.raises(SettingsError, match="target_placement 'gpu': expected auto, separate, orch"):
        InTargetSettings.parse({})


def test_the_start_line_says_where_the_target_and_draft_run(monkeypatch):
    monkeypatch.setenv("SPECDEC_TARGET_PLACEMENT", "orchestrator")
    line = OrchestratorSettings.parse({}).start_line()
    assert "in speculative_decoding's process (draft_placement target)" in line
    assert "the target's engine in speculative_decoding's process" in line


def test_auto_hosts_the_target_unless_it_is_sharded(monkeypatch):
    assert InTargetSettings.parse({}).target_placement == "orchestrator"
    monkeypatch.setenv("SPECDEC_TARGET_DEVICES", "cuda:0,cuda:1")
    assert InTargetSettings.parse({}).target_placement == "separate"
    monkeypatch.delenv("SPECDEC_TARGET_DEVICES")
    monkeypatch.setenv("SPECDEC_TENSOR_PARALLEL", "2")
    assert not OrchestratorSettings.parse({}).drafters.target_hosted


def test_a_sharded_target_is_not_hosted(monkeypatch):
    monkeypatch.setenv("SPECDEC_TARGET_PLACEMENT", "orchestrator")
    monkeypatch.setenv("SPECDEC_TENSOR_PARALLEL", "2")
    with pytest.raises(SettingsError, match="unsharded target: with tensor_parallel 2"):
        OrchestratorSettings.parse({})
