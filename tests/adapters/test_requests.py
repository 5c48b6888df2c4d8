"""specdec.serving.requests: every request field is validated, and each error names its field."""
import math

import numpy as np
import pytest

from specdec import names
from specdec.serving.requests import (InvalidInput, decode_text, parse_request,
                                      parse_stop_words, parse_text)
from specdec.serving.settings import OrchestratorSettings

SETTINGS = OrchestratorSettings(max_seq_len=32, max_sequences=2, max_tokens_limit=20,
                                default_max_tokens=7, max_draft_tokens=5,
                                default_num_draft_tokens=3)
EOS = (2, 9)
VOCAB = 1000


def inputs(prompt=(5, 6, 7), **fields):
    """Request inputs shaped as Triton delivers them for speculative_decoding ([1] each)."""
    out = {names.INPUT_IDS: np.array(prompt, np.int32)}
    for name, value in fields.items():
        out[name] = value if isinstance(value, np.ndarray) else np.array([value])
    return out


def test_defaults():
    req, stream = parse_request(inputs(), SETTINGS, EOS, VOCAB)
    assert req.prompt == [5, 6, 7] and all(type(t) is int for t in req.prompt)
    assert req.max_tokens == SETTINGS.default_max_tokens == 7
    assert req.num_draft_tokens == SETTINGS.default_num_draft_tokens == 3 and not req.auto
    assert req.sampling.temperature == 0.0 and req.sampling.greedy
    assert req.sampling.top_k == 0 and req.sampling.top_p == 1.0
    assert 0 <= req.sampling.seed < 2**64
    assert req.stop == () and req.eos == EOS
    assert stream is False


def test_unseeded_requests_get_different_seeds():
    seeds = {parse_request(inputs(), SETTINGS, EOS, VOCAB)[0].sampling.seed for _ in range(8)}
    assert len(seeds) == 8


def test_every_field():
    req, stream = parse_request(inputs(
        prompt=[1, 2, 3, 4],
        max_tokens=np.array([20], np.int32), stream=np.array([True]),
        temperature=np.array([0.7], np.float32), top_p=np.array([0.5], np.float32),
        top_k=np.array([40], np.int32), seed=np.array([2**64 - 1], np.uint64),
        num_draft_tokens=np.array([5], np.int32),
        stop_ids=np.array([8, 9, 10, 11], np.int32), stop_lengths=np.array([1, 3], np.int32),
    ), SETTINGS, EOS, VOCAB)
    assert req.prompt == [1, 2, 3, 4]
    assert req.max_tokens == 20 and req.num_draft_tokens == 5
    assert req.sampling.temperature == pytest.approx(0.7) and not req.sampling.greedy
    assert req.sampling.top_p == pytest.approx(0.5) and req.sampling.top_k == 40
    assert req.sampling.seed == 2**64 - 1
    assert req.stop == ((8,), (9, 10, 11))
    assert stream is True


@pytest.mark.parametrize("k", [0, 5])
def test_num_draft_tokens_bounds_accepted(k):
    req, _ = parse_request(inputs(num_draft_tokens=np.array([k], np.int32)), SETTINGS, EOS, VOCAB)
    assert req.num_draft_tokens == k and not req.auto


def test_auto_draft_length_is_capped_by_max_draft_tokens():
    """-1, or absent where the server's default is auto, leaves k to the policy."""
    explicit = parse_request(inputs(num_draft_tokens=np.array([-1], np.int32)), SETTINGS, EOS,
                             VOCAB)[0]
    default = parse_request(inputs(), OrchestratorSettings(max_draft_tokens=6), EOS, VOCAB)[0]
    assert explicit.auto and explicit.num_draft_tokens == 5
    assert default.auto and default.num_draft_tokens == 6


def test_only_seeded_sampling_is_reproducible():
    def parse(**f):
        return parse_request(inputs(**f), SETTINGS, EOS, VOCAB)[0].reproducible
    assert parse(temperature=np.array([0.8], np.float32), seed=np.array([3], np.uint64))
    assert not parse(temperature=np.array([0.8], np.float32))
    assert not parse(seed=np.array([3], np.uint64))   # greedy output never depends on k


def test_prompt_just_fits_the_context_window():
    req, _ = parse_request(inputs(prompt=list(range(31))), SETTINGS, EOS, VOCAB)
    assert len(req.prompt) == 31


def test_stream_false_explicitly():
    _, stream = parse_request(inputs(stream=np.array([False])), SETTINGS, EOS, VOCAB)
    assert stream is False


def test_seed_is_kept_and_stop_words_unpacked_with_zero_lengths_skipped():
    req, _ = parse_request(inputs(seed=np.array([12345], np.uint64),
                                  stop_ids=np.array([4, 5, 6, 7, 8, 9], np.int32),
                                  stop_lengths=np.array([2, 0, 1, 3], np.int32)), SETTINGS, EOS, VOCAB)
    assert req.sampling.seed == 12345
    assert req.stop == ((4, 5), (6,), (7, 8, 9))


def test_stop_ids_without_lengths_are_ignored():
    req, _ = parse_request(inputs(stop_ids=np.array([4, 5], np.int32)), SETTINGS, EOS, VOCAB)
    assert req.stop == ()


def test_no_stop_words_from_preprocessing():
    """preprocessing always sends stop_ids/stop_lengths; with no stop words both are empty."""
    req, _ = parse_request(inputs(stop_ids=np.zeros(0, np.int32),
                                  stop_lengths=np.zeros(0, np.int32)), SETTINGS, EOS, VOCAB)
    assert req.stop == ()


BAD = [
    (dict(max_tokens=np.array([0], np.int32)), names.MAX_TOKENS),
    (dict(max_tokens=np.array([-3], np.int32)), names.MAX_TOKENS),
    (dict(max_tokens=np.array([21], np.int32)), names.MAX_TOKENS),
    (dict(temperature=np.array([-0.1], np.float32)), names.TEMPERATURE),
    (dict(temperature=np.array([np.nan], np.float32)), names.TEMPERATURE),
    (dict(temperature=np.array([np.inf], np.float32)), names.TEMPERATURE),
    (dict(top_p=np.array([0.0], np.float32)), names.TOP_P),
    (dict(top_p=np.array([1.01], np.float32)), names.TOP_P),
    (dict(top_p=np.array([np.nan], np.float32)), names.TOP_P),
    (dict(top_k=np.array([-1], np.int32)), names.TOP_K),
    (dict(num_draft_tokens=np.array([-2], np.int32)), names.NUM_DRAFT_TOKENS),
    (dict(num_draft_tokens=np.array([6], np.int32)), names.NUM_DRAFT_TOKENS),
    (dict(max_tokens=np.array([4, 5], np.int32)), names.MAX_TOKENS),
    (dict(temperature=np.array([[0.5, 0.5]], np.float32)), names.TEMPERATURE),
    (dict(seed=np.array([1, 2], np.uint64)), names.SEED),
    (dict(stream=np.zeros(0, bool)), names.STREAM),
]


@pytest.mark.parametrize("fields,field", BAD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(BAD)])
def test_invalid_field_is_named(fields, field):
    with pytest.raises(InvalidInput) as e:
        parse_request(inputs(**fields), SETTINGS, EOS, VOCAB)
    assert str(e.value).startswith(field + ":"), str(e.value)


def test_two_values_where_one_is_expected_reports_the_shape():
    with pytest.raises(InvalidInput, match=r"max_tokens: expected one value, got shape \[2\]"):
        parse_request(inputs(max_tokens=np.array([4, 5], np.int32)), SETTINGS, EOS, VOCAB)


@pytest.mark.parametrize("length", [32, 40])
def test_prompt_longer_than_the_context_window(length):
    with pytest.raises(InvalidInput) as e:
        parse_request(inputs(prompt=list(range(length))), SETTINGS, EOS, VOCAB)
    msg = str(e.value)
    assert msg.startswith(names.TEXT_INPUT + ":") and f"{length} tokens" in msg and "32" in msg


def test_empty_prompt_ids():
    with pytest.raises(InvalidInput, match="^text_input: tokenizes to nothing"):
        parse_request(inputs(prompt=[]), SETTINGS, EOS, VOCAB)


# --- text_input / stop_words, as preprocessing reads them (BYTES tensors of shape [1] / [-1])

def test_parse_text_accepts_bytes_and_str():
    assert parse_text({names.TEXT_INPUT: np.array(["héllo 世界 😀".encode()], object)}) == "héllo 世界 😀"
    assert parse_text({names.TEXT_INPUT: np.array(["plain"], object)}) == "plain"


@pytest.mark.parametrize("value,reason", [
    (None, "missing"),
    (np.array([b""], object), "empty"),
    (np.array([""], object), "empty"),
    (np.array([b"\xff\xfeabc"], object), "not valid UTF-8"),
    (np.array(["é".encode()[:1]], object), "not valid UTF-8"),   # truncated character
    (np.array([b"one", b"two"], object), "expected one string, got 2"),
    (np.array([], object), "expected one string, got 0"),
])
def test_parse_text_rejects(value, reason):
    given = {} if value is None else {names.TEXT_INPUT: value}
    with pytest.raises(InvalidInput) as e:
        parse_text(given)
    assert str(e.value).startswith(names.TEXT_INPUT + ":") and reason in str(e.value)


def test_utf8_error_reports_the_byte_offset():
    with pytest.raises(InvalidInput, match=r"text_input: not valid UTF-8 \(.* at byte 3\)"):
        parse_text({names.TEXT_INPUT: np.array([b"abc\x80def"], object)})


def test_stop_words():
    assert parse_stop_words({}) == []
    words = np.array(["end".encode(), "終わり".encode(), "\n\n"], object)
    assert parse_stop_words({names.STOP_WORDS: words}) == ["end", "終わり", "\n\n"]
    # An empty string is no stop word, as in TensorRT-LLM's requests ("stop_words": "").
    assert parse_stop_words({names.STOP_WORDS: np.array([b"end", b""], object)}) == ["end"]
    assert parse_stop_words({names.STOP_WORDS: np.array([b""], object)}) == []
    with pytest.raises(InvalidInput, match="^stop_words: not valid UTF-8"):
        parse_stop_words({names.STOP_WORDS: np.array([b"\xc3"], object)})


def test_decode_text_names_the_given_field():
    assert decode_text(b"ok") == "ok" and decode_text("ok") == "ok"
    with pytest.raises(InvalidInput, match="^custom: "):
        decode_text(b"\xe2\x82", "custom")


def test_nan_is_not_a_finite_temperature_even_as_python_float():
    with pytest.raises(InvalidInput, match="^temperature:"):
        parse_request(inputs(temperature=np.array([math.nan])), SETTINGS, EOS, VOCAB)


@pytest.mark.parametrize("bad_id", [-1, VOCAB])
def test_prompt_ids_outside_the_vocabulary_are_named(bad_id):
    with pytest.raises(InvalidInput, match=f"^{names.INPUT_IDS}:"):
        parse_request(inputs(prompt=(5, bad_id)), SETTINGS, EOS, VOCAB)


def proposer(value):
    return np.array([value.encode()], object)


def test_proposer_defaults_to_the_head_else_hybrid_with_a_draft_else_lookup():
    assert parse_request(inputs(), SETTINGS, EOS, VOCAB)[0].proposer == "hybrid"
    no_draft = OrchestratorSettings(draft_model_path="none")
    assert parse_request(inputs(), no_draft, EOS, VOCAB)[0].proposer == "ngram"
    for p in ("draft", "ngram", "hybrid"):
        assert parse_request(inputs(proposer=proposer(p)), SETTINGS, EOS, VOCAB)[0].proposer == p
    # A server with a head, with or without a draft model: the head by default, hybrid asked.
    head_only = OrchestratorSettings(draft_model_path="none", eagle_head_path="/head")
    assert head_only.proposers == ("ngram", "suffix", "eagle")
    assert parse_request(inputs(), head_only, EOS, VOCAB)[0].proposer == "eagle"
    assert parse_request(inputs(proposer=proposer("hybrid")), head_only, EOS,
                         VOCAB)[0].proposer == "hybrid"
    both = OrchestratorSettings(eagle_head_path="/head")
    assert parse_request(inputs(), both, EOS, VOCAB)[0].proposer == "eagle"


@pytest.mark.parametrize("value,settings,message", [
    ("lookahead", SETTINGS, "proposer: 'lookahead' is not one of draft, ngram, suffix, eagle, self, medusa, hybrid"),
    ("draft", OrchestratorSettings(draft_model_path="none"),
     "proposer: 'draft' needs a draft model, and $SPECDEC_DRAFT_MODEL is 'none'; this server "
     "drafts with ngram"),
    ("hybrid", OrchestratorSettings(draft_model_path="none"),
     "proposer: 'hybrid' needs a draft model, an EAGLE-3 head, Medusa heads or layers to skip, "
     "and this server has none"),
    ("eagle", SETTINGS, "proposer: 'eagle' needs an EAGLE-3 head, and $SPECDEC_EAGLE_HEAD is not "
                        "set; this server drafts with draft, ngram"),
    ("draft", OrchestratorSettings(draft_model_path="none", eagle_head_path="/h"),
     "proposer: 'draft' needs a draft model, and $SPECDEC_DRAFT_MODEL is 'none'; this server "
     "drafts with ngram, suffix, eagle"),
])
def test_bad_proposer_is_named(value, settings, message):
    with pytest.raises(InvalidInput) as e:
        parse_request(inputs(proposer=proposer(value)), settings, EOS, VOCAB)
    assert str(e.value).startswith(message)


# --- limits (preprocessing, before the tokenizer)

def test_sizes_within_the_limits_pass_and_beyond_them_are_named():
    from specdec.serving.requests import check_prompt_tokens, check_sizes
    from specdec.serving.settings import RequestLimits
    limits = RequestLimits(max_input_bytes=20, max_prompt_tokens=5, max_stop_words=2,
                           max_stop_word_bytes=4)
    check_sizes("é" * 5, ["ab", "çd"], limits)            # 10 + 2 + 3 bytes
    check_prompt_tokens(5, limits)
    for text, words, field, what in [
            ("x" * 21, [], names.TEXT_INPUT, "21 bytes"),
            ("x" * 16, ["abc", "de"], names.TEXT_INPUT, "21 bytes"),   # stop words count too
            ("x", ["a", "b", "c"], names.STOP_WORDS, "3 words"),
            ("x", ["éé€"], names.STOP_WORDS, "7 bytes")]:            # bytes, not characters
        with pytest.raises(InvalidInput) as err:
            check_sizes(text, words, limits)
        assert str(err.value).startswith(field + ":") and what in str(err.value)
    with pytest.raises(InvalidInput, match=r"^text_input: 6 tokens; at most 5"):
        check_prompt_tokens(6, limits)
    check_prompt_tokens(10**6, RequestLimits())          # 0: only the context window bounds it


def test_request_limit_settings(monkeypatch):
    from specdec.serving.settings import RequestLimits, SettingsError
    assert RequestLimits.parse({}) == RequestLimits(1 << 20, 0, 64, 256)
    monkeypatch.setenv("SPECDEC_MAX_STOP_WORDS", "8")
    assert RequestLimits.parse({"max_input_bytes": {"string_value": "1000"}}) == \
        RequestLimits(1000, 0, 8, 256)
    monkeypatch.setenv("SPECDEC_MAX_INPUT_BYTES", "0")
    with pytest.raises(SettingsError, match="max_input_bytes"):
        RequestLimits.parse({})
