"""Fixtures for the adapter tests: a real byte-level BPE tokenizer, tiny real checkpoints that use
its vocabulary, and draft_model / target_model built from them and registered with fake_pb."""
from __future__ import annotations

import asyncio
import os
from types import SimpleNamespace

import numpy as np
import pytest

from specdec import names
from specdec.runtime.config import ModelArgs
from specdec.serving.bls import BlsDrafter, BlsVerifier
from specdec.serving.engine_model import DraftModel, TargetModel
from specdec.serving.metrics import Metrics
from specdec.serving.orchestrator import Orchestrator
from specdec.serving.settings import OrchestratorSettings
from tests.adapters import fake_pb
from tests.tiny_checkpoints import make_checkpoint, make_draft

# Training text for the tokenizer: multi-byte characters of every UTF-8 length.
CORPUS = (
    "Café déjà vu, naïve façade, crème brûlée. Über große Straßen fährt ein Bäcker. "
    "日本語のテキストです。東京は大きい都市です。中文文本测试，你好世界。"
    "한국어 텍스트입니다. Ελληνικά κείμενο. Русский текст для проверки. "
    "Emoji: 😀🎉🚀👍🏽 and flags 🇫🇷🇯🇵, math ∑∫√∞ ≠ ≤ ≥, arrows → ← ↔. "
    "The quick brown fox jumps over the lazy dog; 0123456789 !?#$%&*()[]{}<>.\n"
)
SPECIALS = ["<s>", "</s>"]
MAX_SEQ_LEN = 64


def train_tokenizer(vocab_size: int = 320):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator([CORPUS] * 30, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def train_fallback_tokenizer(vocab_size: int = 400):
    """SentencePiece's layout as Llama 2, Mistral, Gemma and Phi-3 ship it in tokenizer.json:
    "▁" for spaces, characters outside the vocabulary as byte tokens <0x00>..<0xFF>, decoded
    by ByteFallback (Llama 2's decoder sequence)."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    # A small alphabet: most non-ASCII characters go byte by byte.
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", *SPECIALS],
                                  limit_alphabet=40, show_progress=False)
    tok.train_from_iterator([CORPUS] * 30, trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)),
                                   bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="session")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="session")
def fallback_tokenizer():
    return train_fallback_tokenizer()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory, tokenizer):
    """(target, draft) directories; the target's also holds the tokenizer (tokenizer_path's
    fallback) and names </s> as its eos."""
    root = tmp_path_factory.mktemp("adapters")
    eos = tokenizer.convert_tokens_to_ids("</s>")
    target = make_checkpoint(root / "target", "llama2", vocab_size=len(tokenizer),
                             eos_token_id=eos)
    tokenizer.save_pretrained(target)
    draft = make_draft(target, root / "draft", noise=0.5)
    return str(target), str(draft)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    """SPECDEC_* variables override config parameters: none may leak in from the shell."""
    for name in list(os.environ):
        if name.startswith("SPECDEC_"):
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def cancellation_asked_every_round(monkeypatch):
    """A fake request's `cancelled` callable decides by what it has seen (responses sent,
    calls made), not by time: the orchestrator asks it every round here, not at most every
    CANCEL_CHECK_S, whose test sets its own."""
    from specdec.serving import orchestrator
    monkeypatch.setattr(orchestrator, "CANCEL_CHECK_S", 0.0)


@pytest.fixture(autouse=True)
def messages_sent_at_once(monkeypatch):
    """The same for responses and metric updates: sent as they are made (courier.py), so that
    a fake request sees them in the round that made them; test_courier.py and a threaded run of
    test_streamed_equals_non_streamed_equals_in_process keep the server's thread."""
    from specdec.serving import courier
    monkeypatch.setattr(courier, "THREADED", False)


@pytest.fixture(autouse=True)
def fresh_pb():
    fake_pb.reset()
    yield fake_pb
    fake_pb.reset()


def engine_config(checkpoints, role: str, max_sequences: int = 4,
                  max_seq_len: int = MAX_SEQ_LEN) -> dict:
    target, draft = checkpoints
    # The draft in draft_model and the target in target_model, whose calls these tests make
    # (tests/e2e: both in speculative_decoding's process by default; test_hosted_target.py).
    params = {f"{role}_model_path": target if role == "target" else draft,
              "target_model_path": target, "max_sequences": str(max_sequences),
              "max_seq_len": str(max_seq_len), "device": "cpu", "dtype": "float32",
              "draft_placement": "separate", "target_placement": "separate"}
    return {"parameters": {k: {"string_value": v} for k, v in params.items()}}


@pytest.fixture
def serving(checkpoints):
    """draft_model and target_model registered with fake_pb (`build(engine_sequences)` replaces
    them); `orchestrator(eos, **settings)` builds a speculative_decoding Orchestrator over BLS to
    them, with real Metrics on fake_pb's MetricFamily (`gauge`: its active-sequences gauge)."""

    def build(engine_sequences: int = 4):
        draft = DraftModel(fake_pb, engine_config(checkpoints, "draft", engine_sequences))
        target = TargetModel(fake_pb, engine_config(checkpoints, "target", engine_sequences))
        ns.draft, ns.target = draft, target
        ns.draft_bls = fake_pb.register("draft_model", draft, fake_pb.ModelConfig("draft_model"))
        ns.target_bls = fake_pb.register("target_model", target,
                                         fake_pb.ModelConfig("target_model"))
        return ns

    def orchestrator(eos=(), **overrides):
        params = {"max_seq_len": str(MAX_SEQ_LEN), "max_sequences": "4",
                  "target_model_path": checkpoints[0], "draft_placement": "separate",
                  "target_placement": "separate", **{k: str(v) for k, v in overrides.items()}}
        settings = OrchestratorSettings.parse(params)
        ns.metrics = Metrics(fake_pb, "speculative_decoding", settings.max_draft_tokens)
        ns.gauge = ns.metrics.active
        vocab = ModelArgs.from_dir(checkpoints[0]).vocab_size
        return Orchestrator(fake_pb, settings, tuple(eos), vocab, BlsDrafter(fake_pb),
                            BlsVerifier(fake_pb, on_batch=ns.metrics.target_batch), ns.metrics)

    ns = SimpleNamespace(build=build, orchestrator=orchestrator)
    return build()


def orchestrator_request(prompt, cancelled=None, on_send=None, **fields):
    """A speculative_decoding request with inputs typed as its config.pbtxt declares them."""
    dtypes = {names.MAX_TOKENS: np.int32, names.STREAM: np.bool_, names.TEMPERATURE: np.float32,
              names.TOP_P: np.float32, names.TOP_K: np.int32, names.SEED: np.uint64,
              names.NUM_DRAFT_TOKENS: np.int32, names.CANCEL_GENERATION: np.uint64,
              names.RETURN_LOG_PROBS: np.bool_, names.TOP_LOGPROBS: np.int32,
              names.PROMPT_LOGPROBS: np.int32}
    inputs = {names.INPUT_IDS: np.array(prompt, np.int32)}
    for name, value in fields.items():
        if name in (names.STOP_IDS, names.STOP_LENGTHS):
            inputs[name] = np.array(value, np.int32)
        elif name in (names.PROPOSER, names.JSON_SCHEMA):
            inputs[name] = np.array([value.encode()], object)
        else:
            inputs[name] = np.array([value], dtypes[name])
    return fake_pb.Request(inputs, config=fake_pb.ModelConfig("speculative_decoding"),
                           cancelled=cancelled, on_send=on_send)


def run_all(orchestrator, requests) -> None:
    """What speculative_decoding's async execute() does with one batch of requests."""

    async def main():
        await asyncio.gather(*(orchestrator.handle(r) for r in requests))

    asyncio.run(main())


def load_triton_model(name: str, monkeypatch):
    """model_repository/<name>/1/model.py, importing fake_pb as triton_python_backend_utils."""
    import importlib.util
    import sys

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", fake_pb)
    path = fake_pb.MODEL_REPOSITORY / name / "1" / "model.py"
    spec = importlib.util.spec_from_file_location(f"_triton_model_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """The tiny models are far faster on one intra-op thread than on two threads fighting a busy
    core (OpenMP spin-waits): 10-30x on a loaded 2-core machine. Restored after each module, so
    test suites outside tests/adapters keep their thread count."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
