"""The families beside Llama (Qwen3, Gemma 2, Gemma 3, Phi-3/4) and the RoPE scalings, against
transformers: speculative greedy output, real shapes with random weights, the published configs'
layouts, and a refusal naming the field for everything not implemented. Logits at small
configs, through the cache in ragged pieces, are test_model_parity.py's and test_fast_paths.py's
(both run every variant of tests/tiny_checkpoints.py)."""
import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from specdec.runtime.config import CheckpointError, ModelArgs
from specdec.proposers.eagle.checkpoint import load_head
from specdec.runtime.engine import Engine
from specdec.proposers.eagle.drafting import HeadDrafter
from specdec.runtime.batch import Batch
from specdec.records import Request
from specdec.runtime.weights import load_model
from tests.core.conftest import engines, generate
from tests.core.eagle_helpers import trained_head_dir
from tests.tiny_checkpoints import NOISY_NORMS, make_checkpoint, make_draft

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import make_random_pair  # noqa: E402

CPU = torch.device("cpu")
MAX_TOKENS = 40   # prompts of 4-29 tokens: every sequence passes the 8-token windows, and
#                   phi3_longrope's 64-position switch to its long factors happens mid-decode


def prompts(n=4):
    gen = torch.Generator().manual_seed(11)
    return [torch.randint(0, 97, (int(l),), generator=gen).tolist()
            for l in torch.randint(4, 30, (n,), generator=gen)]


def hf_greedy(path: Path, dtype: torch.dtype, prompt_list, max_tokens: int,
              step_by_step: bool = False) -> list[list[int]]:
    """transformers' greedy tokens: `generate`, or (step_by_step) its model fed one token at a
    time through its cache, the prompt in one forward."""
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, attn_implementation="eager").eval()
    out = []
    for p in prompt_list:
        if not step_by_step:
            ids = ref.generate(torch.tensor([p]), max_new_tokens=max_tokens, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
            out.append(ids[0, len(p):].tolist())
            continue
        with torch.no_grad():
            step = ref(torch.tensor([p]), use_cache=True)
            tokens = []
            for _ in range(max_tokens):
                tokens.append(int(step.logits[0, -1].argmax()))
                step = ref(torch.tensor([tokens[-1:]]), past_key_values=step.past_key_values,
                           use_cache=True)
        out.append(tokens)
    return out


@pytest.mark.parametrize("variant", sorted(NOISY_NORMS))
def test_speculative_greedy_equals_transformers_generate(tmp_path, variant):
    """transformers decodes token by token after the prompt; the loop verifies K+1 tokens at a
    time, batched, rolls rejected ones back, and must give the same tokens."""
    target = make_checkpoint(tmp_path / "target", variant)
    pair = target, make_draft(target, tmp_path / "draft", noise=0.3)
    # LongRoPE past original_max_position_embeddings: Phi-3's `generate` throws its cache away
    # when a sequence first passes that length and encodes the whole sequence again with the
    # long factors; its model, like ours, keeps each position's keys as they were computed
    # (docs/configuration.md, "Model families"). The two agree until then.
    want = hf_greedy(target, torch.float64, prompts(), MAX_TOKENS,
                     step_by_step=variant == "phi3_longrope")
    t, d = engines(pair, max_len=128)
    for k in (0, 3):
        got = generate(t, d, [Request(p, MAX_TOKENS, k) for p in prompts()])
        assert [g[0] for g in got] == want, (variant, k)
        if k:
            assert sum(g[1].total_accepted_draft_tokens for g in got) > 0



@pytest.mark.parametrize("variant", ["gemma2", "gemma3", "mistral_window", "phi3_longrope",
                                     "qwen3_qk_norm", "qwen3_window"])
def test_an_eagle3_head_distilled_for_each_family_keeps_greedy_exact(tmp_path, variant):
    """A head trained the way `specdec distill --method eagle3` trains one (on the family's own
    features and embedding) drafts for its target in the engine: output equal to transformers',
    drafts accepted, nothing left behind."""
    target = make_checkpoint(tmp_path / "target", variant)
    head_dir = trained_head_dir(target, tmp_path / "head", steps=25)
    want = hf_greedy(target, torch.float64, prompts(), MAX_TOKENS,
                     step_by_step=variant == "phi3_longrope")
    model = load_model(target, torch.float64, CPU)
    head = load_head(head_dir, model, torch.float64, CPU)
    engine = Engine(model, 8, 128, CPU, head=HeadDrafter(head))
    got = generate(engine, None, [Request(p, MAX_TOKENS, 4, proposer="eagle") for p in prompts()])
    assert [g[0] for g in got] == want, variant
    assert sum(g[1].total_accepted_draft_tokens for g in got) > 0
    assert engine.pool.active == 0 and not engine.q


# --- real shapes, random weights ----------------------------------------------------------------

# The depth, KV heads and widths scaled down (head_dim, the query heads per KV head, the
# vocabulary, norms, windows, RoPE and caps as released). Gemma 3 keeps 6 layers: five windowed,
# one global. (Gemma 3 1B and Gemma 2 2B are these families at one KV head already.)
REAL = {"qwen3-0.6b": 0.125, "qwen3-8b": 0.0625, "gemma2-9b": 0.0625, "gemma3-12b": 0.125,
        "phi4-mini": 0.125, "phi3-mini": 0.0625}


def real_checkpoint(root: Path, preset: str, **overrides) -> Path:
    cfg = {**make_random_pair.scaled(make_random_pair.PRESETS[preset], REAL[preset], None),
           **overrides}
    out = root / preset
    make_random_pair.write_model(out, cfg, make_random_pair.DEFAULT_TARGET, 0, 2**31, None, None)
    return out


@pytest.mark.parametrize("preset", sorted(REAL))
def test_real_shape_logits_match_transformers(tmp_path, preset):
    """A published config scaled down, with its real vocabulary: logits equal
    transformers' in float32, the sequence fed as a prefill, a step and a verification chunk,
    two rows of different lengths batched; windows shrunk to 16 so that the sequence passes
    them (their size is the only change)."""
    full = make_random_pair.PRESETS[preset]
    path = real_checkpoint(tmp_path, preset, **(
        {"sliding_window": 16} if full.get("sliding_window") else {}))
    cfg = json.loads((path / "config.json").read_text())
    args = ModelArgs.from_dir(path)
    assert args.vocab_size == full["vocab_size"] == cfg["vocab_size"]
    assert args.head_dim == make_random_pair.head_dim(full)
    assert args.num_heads // args.num_kv_heads == \
        full["num_attention_heads"] // full["num_key_value_heads"]
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager").eval()
    engine = Engine(load_model(path, torch.float32, CPU), 2, 64, CPU)
    gen = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 4096, (n,), generator=gen) for n in (40, 27)]
    with torch.no_grad():
        want = [ref(s[None]).logits[0] for s in seqs]
    slots = [engine.pool.open(1, 0), engine.pool.open(2, 0)]
    got = [[], []]
    for a0, a1, b0, b1 in ((0, 20, 0, 9), (20, 21, 9, 10), (21, 26, 10, 15), (26, 40, 15, 27)):
        rows = [seqs[0][a0:a1].tolist(), seqs[1][b0:b1].tolist()]
        batch = Batch.build(rows, [a0, b0], slots, engine.cache, CPU)
        with torch.no_grad():
            logits = engine.model.logits(engine.model(batch, engine.cache))
        for r, row in enumerate(rows):
            got[r].append(logits[r, :len(row)])
    for r in range(2):
        torch.testing.assert_close(torch.cat(got[r]), want[r], rtol=1e-4, atol=1e-4)


# --- the published configs' layouts -------------------------------------------------------------

def test_published_layouts_are_read_as_transformers_reads_them(tmp_path):
    """Each preset written as transformers 5 writes it, and in the older form the releases'
    config.json files use (rope_scaling, rope_local_base_freq, sliding_window_pattern), give the
    same layout, and the one transformers builds."""
    g3 = ModelArgs.from_dict(make_random_pair.PRESETS["gemma3-12b"])
    assert [i for i in range(48) if g3.window(i) is None] == [5, 11, 17, 23, 29, 35, 41, 47]
    assert {g3.window(i) for i in range(48)} == {None, 1024}
    assert (g3.rope.theta, g3.rope.type, g3.rope.factor) == (1e6, "linear", 8.0)
    assert (g3.local_rope.theta, g3.local_rope.type) == (10000.0, "default")
    assert g3.layer_rope(0) == 1 and g3.layer_rope(5) == 0
    assert g3.qk_norm and g3.gemma_norms and g3.embed_scale and g3.activation == "gelu_tanh"
    assert g3.attn_scale == 256 ** -0.5 and g3.attn_softcap is None is g3.final_softcap
    g2 = ModelArgs.from_dict(make_random_pair.PRESETS["gemma2-9b"])
    assert [g2.window(i) for i in range(4)] == [4096, None, 4096, None]
    assert (g2.attn_softcap, g2.final_softcap) == (50.0, 30.0) and g2.local_rope is None
    q3 = ModelArgs.from_dict(make_random_pair.PRESETS["qwen3-0.6b"])
    assert q3.qk_norm and not q3.gemma_norms and q3.layer_windows == () and q3.head_dim == 128
    assert q3.num_heads * q3.head_dim == 2048 != q3.hidden_size
    phi = ModelArgs.from_dict(make_random_pair.PRESETS["phi4-mini"])
    assert phi.rotary_dim == 96 and phi.fused_checkpoint and phi.rope.type == "longrope"
    assert phi.rope.original_max_position == 4096
    assert phi.rope.attention_factor == pytest.approx((1 + 3.4657359 / 8.3177662) ** 0.5)
    assert ModelArgs.from_dict(make_random_pair.PRESETS["phi3-mini"]).window(31) == 2047
    for preset, cfg in make_random_pair.PRESETS.items():
        config = make_random_pair.hf_config(cfg)
        config.save_pretrained(tmp_path / preset)
        written = json.loads((tmp_path / preset / "config.json").read_text())
        ours = replace(ModelArgs.from_dict(written), eos_token_ids=())   # the classes' defaults
        assert ours == ModelArgs.from_dict(cfg), preset
        kinds = (getattr(config, "layer_types", None)
                 or ["full_attention"] * config.num_hidden_layers)
        if getattr(config, "sliding_window", None) and config.model_type in ("mistral", "phi3"):
            kinds = ["sliding_attention"] * config.num_hidden_layers
        assert [ours.window(i) is not None for i in range(ours.num_layers)] == \
            [k == "sliding_attention" for k in kinds], preset


# --- refusals -----------------------------------------------------------------------------------

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16)
REFUSED = {
    "model_type": ("qwen3_moe", {}, "model_type 'qwen3_moe' is not supported"),
    "gemma3 image-text": ("gemma3", {}, "model_type 'gemma3' is Gemma 3's image-text"),
    "mlp_bias": ("llama", {"mlp_bias": True}, "mlp_bias = True is not supported"),
    "use_bidirectional_attention": ("gemma3_text", {"use_bidirectional_attention": True},
                                    "use_bidirectional_attention = True is not supported"),
    "quantization_config": ("llama", {"quantization_config": {"quant_method": "awq"}},
                            "quantization_config = .* is not supported"),
    "hidden_act": ("qwen3", {"hidden_act": "relu"}, "hidden_act 'relu' is not supported"),
    "hidden_activation": ("gemma2", {"hidden_activation": "gelu"},
                          "hidden_activation 'gelu' is not supported"),
    "rope type": ("llama", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
                  "rope type 'dynamic' is not supported"),
    "layer_types value": ("qwen3", {"layer_types": ["full_attention", "chunked_attention"]},
                          "layer_types 'chunked_attention' is not supported"),
    "layer_types length": ("gemma2", {"layer_types": ["full_attention"]},
                           "expected a list of 2 entries"),
    "layer_types without a window": ("mistral", {"sliding_window": None, "layer_types": [
        "sliding_attention", "full_attention"]}, "sliding_window is None"),
    "longrope factors": ("phi3", {"rope_scaling": {
        "type": "longrope", "short_factor": [1.0] * 3, "long_factor": [1.0] * 8},
        "original_max_position_embeddings": 32}, "short_factor has 3 values, the rotary "
                                                 "dimensions need 8"),
    "partial_rotary_factor": ("phi3", {"partial_rotary_factor": 0.1},
                              "partial_rotary_factor 0.1 gives 1 rotary"),
    "missing field": ("llama", {"vocab_size": None}, "'vocab_size'"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_fields_are_refused_by_name(tmp_path, case):
    model_type, change, message = REFUSED[case]
    cfg = {**BASE, "model_type": model_type, **change}
    if cfg.get("vocab_size") is None:
        del cfg["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=rf"{tmp_path / 'config.json'}: .*{message}"):
        ModelArgs.from_dir(tmp_path)
    # and without the offending change, the same config loads
    if model_type not in ("qwen3_moe", "gemma3") and case != "missing field":
        ModelArgs.from_dict({**BASE, "model_type": model_type})
