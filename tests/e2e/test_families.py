"""A real tritonserver serves a Gemma 3 pair at real shapes (random weights, the published
configs scaled down, the vocabulary as released, 262208): greedy output, plain and drafted by
the draft model and by a random EAGLE-3 head of the shape `specdec distill --method eagle3`
makes, equals transformers' `generate` on the target, with the target's engine in
speculative_decoding's process (SPECDEC_TARGET_PLACEMENT=orchestrator). Its windows are shrunk
to 16 tokens so that the requests pass them (the target's 5 windowed layers with their local
RoPE, and one global).

One family served: the served path is the in-process engine (tests/core/test_families.py
checks every family there, Qwen3 among them) behind the same tokenizer; Gemma 3 is the one
furthest from Llama (the largest vocabulary, windows, local RoPE, scaled embeddings). A Qwen3
pair served the same way took 60 s of CI for nothing the other tests miss; a Llama 3 shape is
served by test_eagle_real_shape.py and test_tensor_parallel.py. The pair reads the embedded
tokenizer, so the OpenAI gateway over it is test_openai.py's."""
import sys
from pathlib import Path

import pytest
import torch
import transformers

from specdec.runtime.config import ModelArgs
from specdec_client import GenerationParams, generate
from tests.e2e.conftest import heldout_prompts, launch

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

PROMPTS = heldout_prompts(2)
MAX_TOKENS = 24
# target preset, draft preset, scale, config overrides of both. The 270M draft: its embedding,
# the bulk of a scaled Gemma (one KV head is as far as the heads shrink), is half the 1B's.
PAIRS = {
    "gemma3": ("gemma3-12b", "gemma3-270m", 0.125, {"sliding_window": 16, "vocab_size": 262208}),
}


def write_pair(root: Path, family: str) -> tuple[Path, Path]:
    """`make_random_pair.py --readable` in process: output rows past the tokenizer's 4096 ids
    are zero, so that greedy output decodes to text."""
    target, draft, scale, overrides = PAIRS[family]
    live = make_random_pair.tokenizer_size(make_random_pair.DEFAULT_TARGET)
    dirs = []
    for role, preset, seed in (("target", target, 0), ("draft", draft, 1)):
        cfg = {**make_random_pair.scaled(make_random_pair.PRESETS[preset], scale, None),
               **overrides}
        make_random_pair.write_model(root / role, cfg, make_random_pair.DEFAULT_TARGET, seed,
                                     2**31, None, None, live)
        dirs.append(root / role)
    return dirs[0], dirs[1]


@pytest.fixture(scope="module", params=sorted(PAIRS))
def family_server(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    target, draft = write_pair(root, request.param)
    make_random_pair.write_head(root / "head", target, 2)
    env = {"SPECDEC_TARGET_MODEL": str(target), "SPECDEC_DRAFT_MODEL": str(draft),
           "SPECDEC_EAGLE_HEAD": str(root / "head"),
           "SPECDEC_MAX_SEQUENCES": "2", "SPECDEC_MAX_SEQ_LEN": "256",
           "SPECDEC_DRAFT_TIMEOUT_S": "600",
           # The target's engine, the draft and the head in speculative_decoding's process:
           # the hosted placement at a real shape (test_placement.py has it on the default pair).
           "SPECDEC_TARGET_PLACEMENT": "orchestrator"}
    for server in launch(tmp_path_factory, env):
        yield request.param, target, server


def test_real_shape_family_is_served_exactly(family_server):
    family, target, server = family_server
    args = ModelArgs.from_dir(target)
    assert args.model_type == {"gemma3": "gemma3_text"}[family]
    assert args.vocab_size > 150_000 and args.num_heads > args.num_kv_heads
    tokenizer = transformers.AutoTokenizer.from_pretrained(target)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        target, dtype=torch.float32, attn_implementation="eager").eval()
    wants = []
    for prompt in PROMPTS:
        ids = tokenizer(prompt)["input_ids"]
        out = ref.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, do_sample=False,
                           eos_token_id=list(args.eos_token_ids) or None, pad_token_id=0)
        tokens = out[0, len(ids):].tolist()
        want = tokenizer.decode(tokens)
        assert want.strip(), "the readable pair should decode to text"
        # The random head's rounds are the slowest here (5 s a prompt): one prompt shows it.
        settings = ((4, "draft"), (4, "eagle"), (0, None)) if not wants else ((4, "draft"),)
        for k, proposer in settings:
            got = generate(server.http, prompt, GenerationParams(
                max_tokens=MAX_TOKENS, temperature=0.0, num_draft_tokens=k, proposer=proposer))
            assert got.text == want, (family, k, proposer, prompt)
            assert got.num_output_tokens == len(tokens)
            assert (got.total_draft_tokens > 0) == (k > 0)
        wants.append(want)
    # Hosted, a round drafted by the head is no BLS call at all (target_model's: one).
    assert server.metric("specdec_bls_calls_per_round", proposer="eagle") == 0.0
