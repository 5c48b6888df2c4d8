"""specdec.serving.detokenize with a real byte-level BPE tokenizer: streamed text is exact.

The orchestrator side is `window()` over the ids shown so far plus the new ones (as
Orchestrator._response sends them); the postprocessing side is `piece()` with the same decode
call as model_repository/postprocessing/1/model.py, and in some tests that model.py itself,
run on fake_pb.
"""
import json
import random

import numpy as np
import pytest

from specdec import names
from specdec.serving.detokenize import MAX_WINDOW, WINDOW, fallback_bytes, piece, window
from specdec.serving.tokenizer import special_ids
from tests.adapters import fake_pb
from tests.adapters.conftest import load_triton_model

# Accents, CJK, Hangul, Greek, Cyrillic, emoji (with a skin-tone modifier and a flag), symbols;
# ë, ’, —, Ж, ✓ and 🦀 are not in the tokenizer's training text, so they go byte by byte.
TEXT = ("Zoë’s café — crème brûlée, naïve façade. 日本語のテキストです。中文文本测试！"
        " 한국어 텍스트. Ελληνικά, Русский, Жук ✓. Emoji 😀🎉🚀👍🏽🇫🇷🦀 ∑∫√∞ → done.")
REPLACEMENT = "\ufffd"


def decoder(tokenizer):
    """postprocessing's decode: ids -> text, special tokens skipped."""
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


def chunked(ids, sizes):
    at, i = 0, 0
    while at < len(ids):
        n = sizes[i % len(sizes)]
        yield ids[at:at + n]
        at, i = at + n, i + 1


def stream_pieces(decode, ids, sizes, special=frozenset(), byte_of=None):
    """One response per chunk, as the orchestrator sends them; the last one is final."""
    shown, pieces = [], []
    chunks = list(chunked(ids, sizes))
    for j, new in enumerate(chunks):
        sent, prefix = window(shown, new, special)
        pieces.append(piece(decode, sent, prefix, j == len(chunks) - 1, byte_of))
        shown.extend(new)
    return pieces


@pytest.fixture(scope="module")
def text_ids(tokenizer):
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    decode = decoder(tokenizer)
    assert decode(ids) == TEXT
    # Not an idle test: many tokens are parts of a character, alone they decode to U+FFFD.
    assert sum(REPLACEMENT in decode([i]) for i in ids) >= 10
    assert len(ids) > 3 * WINDOW
    return ids


def test_one_token_per_response(tokenizer, text_ids):
    pieces = stream_pieces(decoder(tokenizer), text_ids, [1])
    assert len(pieces) == len(text_ids)
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)
    # A character split over tokens comes out once, whole: some responses hold back everything.
    assert pieces.count("") >= 5


@pytest.mark.parametrize("seed", range(6))
def test_any_chunking_gives_the_same_text(tokenizer, text_ids, seed):
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5) for _ in range(len(text_ids))]
    pieces = stream_pieces(decoder(tokenizer), text_ids, sizes)
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)


def test_single_response_is_the_whole_decode(tokenizer, text_ids):
    sent, prefix = window([], text_ids)
    assert (sent, prefix) == (text_ids, 0)
    assert piece(decoder(tokenizer), sent, prefix, True) == TEXT


@pytest.mark.parametrize("seed", range(7))
def test_byte_fallback_streams_exact_text(fallback_tokenizer, seed):
    """A byte-fallback decode makes a whole run of byte tokens U+FFFDs while its last character
    is unfinished, and a window that starts inside a run decodes all of it so: streamed, 'Zoë’s'
    came out 'Zoë�’s' and the CJK text as U+FFFDs."""
    tok = fallback_tokenizer
    decode = decoder(tok)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"]
    assert decode(ids) == TEXT
    byte_of = fallback_bytes(tok.get_vocab())
    assert len(byte_of) == 256
    # Not an idle test: runs of byte tokens longer than a window, windows starting inside them.
    runs = "".join("b" if i in byte_of else "." for i in ids).split(".")
    assert max(map(len, runs)) > WINDOW and sum(i in byte_of for i in ids) > 100
    rng = random.Random(seed)
    sizes = [rng.randint(1, 5) for _ in ids] if seed else [1]
    pieces = stream_pieces(decode, ids, sizes, byte_of=byte_of)
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)
    assert "".join(stream_pieces(decode, ids, sizes)) != TEXT   # as a byte-level decode


def test_byte_fallback_text_that_ends_inside_a_character(fallback_tokenizer):
    """A generation cut inside a character (max_tokens): streamed in any chunking and in one
    response alike, the characters before it whole and its bytes as U+FFFDs, where the
    tokenizer's own decode makes the whole run of byte tokens U+FFFDs."""
    tok = fallback_tokenizer
    decode = decoder(tok)
    byte_of = fallback_bytes(tok.get_vocab())
    ids = tok("Zoë’", add_special_tokens=False)["input_ids"][:-1]   # ’ is e2 80 99
    assert [byte_of.get(i) for i in ids[-3:]] == [0xAB, 0xE2, 0x80]
    assert decode(ids).endswith(REPLACEMENT * 4)                   # ë went with the run
    whole = piece(decode, ids, 0, True, byte_of)
    assert whole == "Zoë" + REPLACEMENT * 2
    for sizes in ([1], [2, 1], [3]):
        assert "".join(stream_pieces(decode, ids, sizes, byte_of=byte_of)) == whole


def test_fallback_bytes_only_for_a_byte_fallback_vocabulary(tokenizer, fallback_tokenizer):
    assert fallback_bytes(tokenizer.get_vocab()) == {}
    byte_of = fallback_bytes(fallback_tokenizer.get_vocab())
    assert byte_of[fallback_tokenizer.convert_tokens_to_ids("<0xE2>")] == 0xE2


def test_window_carries_at_most_window_shown_ids():
    shown = list(range(100, 120))
    for n in range(len(shown) + 1):
        sent, prefix = window(shown[:n], [7, 8])
        assert prefix == min(n, WINDOW)
        assert sent == shown[:n][n - prefix:] + [7, 8]


def test_window_reaches_past_special_ids_to_window_others():
    special = frozenset({0, 1})
    shown = [5, 6, 0, 7, 1, 1, 8, 9, 10, 11, 12, 13]
    sent, prefix = window(shown, [20], special)
    # 8 ids that are not special, and the 3 special ids among them.
    assert (sent, prefix) == (shown[1:] + [20], 11)
    # None among the last WINDOW: the plain window.
    assert window(shown + [14, 15], [20], special) == window(shown + [14, 15], [20])
    # Fewer than WINDOW others: everything shown.
    assert window([0, 5, 1], [20], special) == ([0, 5, 1, 20], 3)
    # A long run of special ids: at most MAX_WINDOW of them.
    sent, prefix = window([5] * 10 + [0] * 100, [20], special)
    assert (sent, prefix) == ([0] * MAX_WINDOW + [20], MAX_WINDOW)


def test_special_ids_are_read_from_the_tokenizer_files(checkpoints, tokenizer, tmp_path):
    marked = {tokenizer.convert_tokens_to_ids(t) for t in ("<s>", "</s>")}
    assert special_ids(checkpoints[0]) == marked
    # tokenizer_config.json alone, a token marked special there and one not.
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": {
        "7": {"content": "<x>", "special": True}, "9": {"content": "<y>", "special": False}}}))
    assert special_ids(str(tmp_path)) == {7}
    assert special_ids(str(tmp_path / "none")) == frozenset()


def test_final_response_flushes_an_incomplete_character(tokenizer):
    decode = decoder(tokenizer)
    good = tokenizer("café ", add_special_tokens=False)["input_ids"]
    # The first byte of a 3-byte character (漢 = e6 bc a2) and nothing after it.
    partial = [i for i in tokenizer("漢", add_special_tokens=False)["input_ids"]][:1]
    assert REPLACEMENT in decode(partial)
    ids = good + partial
    held = stream_pieces(decode, ids, [len(good), 1])        # the last response is final
    assert held == ["café ", REPLACEMENT]
    # Not final: the incomplete character is held back, nothing of it is shown.
    sent, prefix = window(good, partial)
    assert piece(decode, sent, prefix, False) == ""
    assert piece(decode, sent, prefix, True) == REPLACEMENT
    # Final with only a partial character: flushed too.
    assert piece(decode, partial, 0, True) == REPLACEMENT


def test_special_tokens_are_not_shown(tokenizer):
    decode = decoder(tokenizer)
    ids = tokenizer("ab 日本", add_special_tokens=False)["input_ids"]
    eos = tokenizer.convert_tokens_to_ids("</s>")
    pieces = stream_pieces(decode, ids[:2] + [eos] + ids[2:], [1])
    assert "".join(pieces) == "ab 日本"


# --- the real postprocessing model.py on fake_pb

@pytest.fixture
def postprocessing(checkpoints, monkeypatch):
    module = load_triton_model("postprocessing", monkeypatch)
    model = module.TritonPythonModel()
    # tokenizer_path empty: falls back to the target model's directory, where the tokenizer is.
    config = {"parameters": {"tokenizer_path": {"string_value": ""},
                             "target_model_path": {"string_value": checkpoints[0]}}}
    model.initialize({"model_config": json.dumps(config), "model_name": "postprocessing"})
    return model


def post_request(ids, prefix, final):
    return fake_pb.Request({names.OUTPUT_IDS: np.array(ids, np.int32),
                            names.PREFIX_LENGTH: np.array([prefix], np.int32),
                            names.IS_FINAL: np.array([final], bool)},
                           config=fake_pb.ModelConfig("postprocessing"))


def text_of(response):
    assert not response.has_error(), response.error().message()
    fake_pb.ModelConfig("postprocessing").check_outputs(response.output_tensors())
    return fake_pb.get_output_tensor_by_name(response, names.TEXT_OUTPUT).as_numpy()[0].decode()


def test_postprocessing_model_streams_byte_fallback_text(fallback_tokenizer, tmp_path,
                                                         monkeypatch):
    fallback_tokenizer.save_pretrained(tmp_path)
    model = load_triton_model("postprocessing", monkeypatch).TritonPythonModel()
    config = {"parameters": {"tokenizer_path": {"string_value": str(tmp_path)}}}
    model.initialize({"model_config": json.dumps(config), "model_name": "postprocessing"})
    ids = fallback_tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    shown, requests = [], []
    for j, new in enumerate(ids):
        sent, prefix = window(shown, [new])
        requests.append(post_request(sent, prefix, j == len(ids) - 1))
        shown.append(new)
    pieces = [text_of(r) for r in model.execute(requests)]
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)


@pytest.mark.parametrize("sizes", [[1], [3, 1, 5, 2, 4]])
def test_postprocessing_model_streams_exact_text(postprocessing, text_ids, sizes):
    shown, requests = [], []
    chunks = list(chunked(text_ids, sizes))
    for j, new in enumerate(chunks):
        sent, prefix = window(shown, new)
        requests.append(post_request(sent, prefix, j == len(chunks) - 1))
        shown.extend(new)
    # One execute() with every response of the stream: each is decoded on its own.
    pieces = [text_of(r) for r in postprocessing.execute(requests)]
    assert "".join(pieces) == TEXT
    assert not any(REPLACEMENT in p for p in pieces)


def test_postprocessing_model_bad_request_is_its_own_error(postprocessing, text_ids):
    good = post_request(text_ids[:4], 0, True)
    bad = post_request([-1], 0, True)              # decode() raises on a negative id
    responses = postprocessing.execute([good, bad, good])
    assert len(responses) == 3
    assert text_of(responses[0]) == text_of(responses[2]) == TEXT[:len(text_of(responses[0]))]
    assert responses[1].has_error()
    assert responses[1].error().code() == fake_pb.TritonError.INTERNAL


# --- known limitations (documented, expected to fail until detokenize.py handles them)

def byte_token(tokenizer, byte: int) -> int:
    """The byte-level BPE token of one raw byte."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return tokenizer.convert_tokens_to_ids(bytes_to_unicode()[byte])


def test_long_run_of_invalid_bytes_streams_like_the_full_decode(tokenizer):
    decode = decoder(tokenizer)
    # 'A', ten lone UTF-8 continuation bytes (invalid text: ten U+FFFD), 'A'.
    ids = [byte_token(tokenizer, b) for b in [0x41, *range(0x80, 0x8A), 0x41]]
    assert decode(ids) == "A" + REPLACEMENT * 10 + "A"
    assert "".join(stream_pieces(decode, ids, [1])) == decode(ids)   # streamed: only 8 U+FFFD


@pytest.mark.parametrize("run", [WINDOW - 1, 3 * WINDOW])
def test_special_tokens_after_a_split_character(tokenizer, checkpoints, run):
    """A window of é's second byte and special tokens alone decoded to one U+FFFD, which the
    cut took for a held-back character: é's tail came out again ("Aé\ufffdB"). The windows now
    reach past special ids (read from the checkpoint's files, as speculative_decoding reads
    them)."""
    decode = decoder(tokenizer)
    bos = tokenizer.convert_tokens_to_ids("<s>")
    # 'A', é as its two bytes c3 a9, a run of special tokens (decode to nothing), 'B'.
    ids = ([byte_token(tokenizer, b) for b in (0x41, 0xC3, 0xA9)] + [bos] * run
           + [byte_token(tokenizer, 0x42)])
    assert decode(ids) == "AéB"
    assert "".join(stream_pieces(decode, ids, [1], special_ids(checkpoints[0]))) == "AéB"
