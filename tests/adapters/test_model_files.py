"""The model_repository/*/1/model.py adapters themselves, on fake_pb, wired like the ensemble:
text -> preprocessing -> speculative_decoding (BLS to draft_model / target_model) ->
postprocessing -> text. Configured like a deployment: each model gets its own config.pbtxt
parameters, and $SPECDEC_* variables set the paths and the shared sizes for all of them."""
import asyncio

import numpy as np
import pytest

from specdec import names
from tests.adapters import fake_pb
from tests.adapters.conftest import load_triton_model

FINAL = fake_pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
PROMPT = "Zoë’s café — 日本語のテキスト 😀 naïve 中文"
MODELS = ("preprocessing", "draft_model", "target_model", "speculative_decoding", "postprocessing")


@pytest.fixture
def pipeline(checkpoints, monkeypatch):
    target, draft = checkpoints
    for name, value in {"SPECDEC_TARGET_MODEL": target, "SPECDEC_DRAFT_MODEL": draft,
                        "SPECDEC_MAX_SEQ_LEN": "64", "SPECDEC_MAX_SEQUENCES": "3",
                        "SPECDEC_DEVICE": "cpu", "SPECDEC_DTYPE": "float32"}.items():
        monkeypatch.setenv(name, value)
    models, configs = {}, {}
    for name in MODELS:
        configs[name] = fake_pb.ModelConfig(name)
        models[name] = load_triton_model(name, monkeypatch).TritonPythonModel()
        models[name].initialize(configs[name].args())
    for name in ("draft_model", "target_model"):
        fake_pb.register(name, models[name], configs[name])
    return models, configs


def generate(pipeline, text, cancelled=None, **fields):
    """One ensemble request: (text pieces, orchestrator responses) or the first error."""
    models, configs = pipeline
    pre_inputs = {names.TEXT_INPUT: np.array([text if isinstance(text, bytes) else text.encode()],
                                             object)}
    if "stop_words" in fields:
        pre_inputs[names.STOP_WORDS] = np.array([w.encode() for w in fields.pop("stop_words")],
                                                object)
    (pre,) = models["preprocessing"].execute(
        [fake_pb.Request(pre_inputs, config=configs["preprocessing"])])
    if pre.has_error():
        return pre.error(), []
    configs["preprocessing"].check_outputs(pre.output_tensors())
    inputs = {t.name(): t.as_numpy() for t in pre.output_tensors()}
    types = configs["speculative_decoding"].inputs
    for name, value in fields.items():
        inputs[name] = np.array([value], {"TYPE_INT32": np.int32, "TYPE_BOOL": bool,
                                          "TYPE_FP32": np.float32, "TYPE_UINT64": np.uint64}[types[name][0]])
    request = fake_pb.Request(inputs, config=configs["speculative_decoding"], cancelled=cancelled)
    assert asyncio.run(models["speculative_decoding"].execute([request])) is None
    flags = [f for _, f in request.sender.sent]
    assert flags.count(FINAL) == 1 and flags[-1] == FINAL
    responses = request.sender.responses()
    if responses and responses[0].has_error():
        return responses[0].error(), responses
    post = models["postprocessing"].execute([
        fake_pb.Request({n: fake_pb.get_output_tensor_by_name(r, n).as_numpy()
                         for n in (names.OUTPUT_IDS, names.PREFIX_LENGTH, names.IS_FINAL)},
                        config=configs["postprocessing"]) for r in responses])
    pieces = []
    for p in post:
        assert not p.has_error(), p.error().message()
        pieces.append(fake_pb.get_output_tensor_by_name(p, names.TEXT_OUTPUT).as_numpy()[0].decode())
    return pieces, responses


def ids_of(responses):
    out = []
    for r in responses:
        ids = fake_pb.get_output_tensor_by_name(r, names.OUTPUT_IDS).as_numpy().tolist()
        out += ids[int(fake_pb.get_output_tensor_by_name(r, names.PREFIX_LENGTH).as_numpy()[0]):]
    return out


def stat(response, name):
    return fake_pb.get_output_tensor_by_name(response, name).as_numpy()[0]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_streamed_text_equals_full_text(pipeline, tokenizer, temperature):
    fields = dict(max_tokens=40, temperature=temperature, seed=7, num_draft_tokens=4)
    whole, whole_responses = generate(pipeline, PROMPT, stream=False, **fields)
    pieces, responses = generate(pipeline, PROMPT, stream=True, **fields)
    assert len(whole) == 1 and len(pieces) > 3
    ids = ids_of(whole_responses)
    assert ids_of(responses) == ids and len(ids) > 0
    assert "".join(pieces) == whole[0] == tokenizer.decode(ids, skip_special_tokens=True)
    last = responses[-1]
    assert stat(last, names.FINISH_REASON).decode() in ("length", "eos")
    assert stat(last, names.NUM_OUTPUT_TOKENS) == len(ids)


def test_defaults_come_from_config_pbtxt(pipeline):
    models, _ = pipeline
    s = models["speculative_decoding"].orchestrator.settings
    assert (s.max_seq_len, s.max_sequences) == (64, 3)             # from the environment
    assert (s.default_max_tokens, s.max_draft_tokens) == (64, 8)   # from config.pbtxt
    # auto placements: the target's engine in speculative_decoding's process with the draft in
    # it, target_model and draft_model loading nothing.
    target = models["speculative_decoding"].orchestrator.verifier.model.engine
    assert models["draft_model"].model.engine is None
    assert models["target_model"].model.engine is None
    for engine in (target, target.drafters["draft"].engine):
        assert (engine.max_len, engine.pool.num_slots) == (64, 3)


def test_stop_word(pipeline, tokenizer):
    pieces, responses = generate(pipeline, PROMPT, max_tokens=30)
    ids = ids_of(responses)
    # A stop word made of generated tokens 6..7, spelled as text; preprocessing re-tokenizes it.
    word = tokenizer.decode(ids[5:7])
    stop_ids = tokenizer(word, add_special_tokens=False)["input_ids"]
    if stop_ids != ids[5:7] or "\ufffd" in word:
        pytest.skip("the generated tokens do not re-tokenize to themselves")
    stopped, responses = generate(pipeline, PROMPT, max_tokens=30, stop_words=[word])
    assert stat(responses[-1], names.FINISH_REASON).decode() == "stop"
    assert word not in "".join(stopped) and pieces[0].startswith("".join(stopped))


@pytest.mark.parametrize("text,message", [
    (b"\xffbad", "text_input: not valid UTF-8"),
    (b"", "text_input: empty"),
])
def test_bad_text_is_invalid_arg_from_preprocessing(pipeline, text, message):
    error, _ = generate(pipeline, text)
    assert error.code() == fake_pb.TritonError.INVALID_ARG and error.message().startswith(message)


def test_bad_field_is_invalid_arg_from_the_orchestrator(pipeline):
    error, responses = generate(pipeline, PROMPT, top_k=-2)
    assert len(responses) == 1
    assert error.code() == fake_pb.TritonError.INVALID_ARG and error.message().startswith("top_k:")


def test_metrics_add_up_to_the_returned_statistics(pipeline):
    models, _ = pipeline
    finished = []
    for i, fields in enumerate([dict(max_tokens=12), dict(max_tokens=9, stream=True),
                                dict(max_tokens=20, temperature=0.8, seed=3)]):
        _, responses = generate(pipeline, PROMPT, num_draft_tokens=3, **fields)
        finished.append(responses[-1])
    _, cancelled = generate(pipeline, PROMPT, max_tokens=30, stream=True, num_draft_tokens=4,
                            cancelled=lambda sender: len(sender.sent) >= 2)
    _, auto = generate(pipeline, PROMPT, max_tokens=16)         # k chosen per round
    generate(pipeline, PROMPT, top_p=2.0)

    def value(name, **labels):   # summed over the labels not given (proposer)
        found = fake_pb.metrics(name, model="speculative_decoding", **labels)
        assert found, (name, labels)
        return sum(m.value() for m in found)

    assert value("specdec_requests_total", finish_reason="length") == 4
    assert value("specdec_requests_total", finish_reason="cancelled") == 1
    assert value("specdec_requests_total", finish_reason="invalid") == 1   # top_p 2.0
    assert value("specdec_requests_total", finish_reason="error") == 0
    every = finished + [cancelled[-1], auto[-1]]
    assert value("specdec_draft_tokens_total") == sum(stat(r, names.TOTAL_DRAFT_TOKENS) for r in every)
    assert value("specdec_accepted_tokens_total") == \
        sum(stat(r, names.TOTAL_ACCEPTED_DRAFT_TOKENS) for r in every)
    assert value("specdec_output_tokens_total") == sum(stat(r, names.NUM_OUTPUT_TOKENS) for r in every)
    assert value("specdec_draft_tokens_total", proposer="ngram") == \
        sum(stat(r, names.NGRAM_DRAFT_TOKENS) for r in every)
    assert value("specdec_accepted_tokens_total", proposer="ngram") == \
        sum(stat(r, names.NGRAM_ACCEPTED_TOKENS) for r in every)
    drafted_at = [value("specdec_drafted_at_position_total", position=str(j)) for j in range(1, 9)]
    assert sum(drafted_at) == value("specdec_draft_tokens_total")
    assert value("specdec_rounds_total") >= drafted_at[0] >= drafted_at[3] > 0   # k = 3 and 4
    # Past the fixed requests' 4 only the auto request drafted (suffix decoding finds this
    # prompt's earlier answers and proposes them long).
    assert sum(drafted_at[4:]) <= stat(auto[-1], names.TOTAL_DRAFT_TOKENS)
    assert value("specdec_active_sequences") == 0
    # Every round that drafted recorded its chosen k: the 3 + 4 fixed ones among them.
    (chosen,) = fake_pb.metrics("specdec_chosen_draft_tokens", model="speculative_decoding")
    assert chosen.observations.count(4) >= 1 and chosen.observations.count(3) >= 3
    assert sum(chosen.observations) == value("specdec_draft_tokens_total")
    assert 0 not in chosen.observations
    assert all(m.value() == 0 for m in fake_pb.metrics("specdec_draft_failures_total"))
    # The live estimates reach their gauges (sent with the counters).
    (a1,) = fake_pb.metrics("specdec_acceptance_estimate", model="speculative_decoding",
                            proposer="draft", position="1")
    (verify,) = fake_pb.metrics("specdec_round_cost_seconds", model="speculative_decoding",
                                part="verify_call")
    assert 0 < a1.value() < 1 and verify.value() > 0
    # The draft's slots in target_model's process (auto placement) are shown as draft_model's.
    for labels in ({"model": "draft_model", "placement": "target"}, {"model": "target_model"}):
        (used,) = fake_pb.metrics("specdec_kv_slots_used", **labels)
        (total,) = fake_pb.metrics("specdec_kv_slots_total", **labels)
        assert max(used.history) >= 1 and used.value() == 0 and total.value() == 3
