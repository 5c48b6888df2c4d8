"""EAGLE-3 heads in both published formats: config reading and refusals, and the head's logits
against a reference forward written here from the formats' definition (EAGLE's cnets.py,
speculators' Eagle3 model), at the shapes of a published Llama-3.1-8B head scaled down in width
(vocabulary 128256, draft vocabulary 32000, grouped-query attention)."""
import json
from dataclasses import replace

import pytest
import torch
import transformers
from safetensors.torch import save_file

from specdec.runtime.config import CheckpointError, ModelArgs
from specdec.proposers.eagle.checkpoint import load_head, save_speculators
from specdec.proposers.eagle.config import head_args
from specdec.proposers.eagle.head import EagleHead
from specdec.runtime.kv_cache import KVCache
from specdec.runtime.batch import Batch
from specdec.runtime.model import Transformer
from specdec.runtime.weights import load_model
from tests.tiny_checkpoints import make_checkpoint

V, VD, H, HEADS, KV, HD, I = 128256, 32000, 256, 4, 2, 64, 640
LAYERS = 8


@pytest.fixture(scope="module")
def target():
    args = ModelArgs(vocab_size=V, hidden_size=H, intermediate_size=I, num_layers=LAYERS,
                     num_heads=HEADS, num_kv_heads=KV, head_dim=HD, rms_norm_eps=1e-5,
                     max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = Transformer(args)
    model.tie_weights()
    return model.eval().requires_grad_(False)


def layer_config():
    """yuhuili/EAGLE3-LLaMA3.1-Instruct-8B's layer fields, in width scaled to the test target."""
    return {"hidden_size": H, "intermediate_size": I, "num_attention_heads": HEADS,
            "num_key_value_heads": KV, "head_dim": HD, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "max_position_embeddings": 2048, "num_hidden_layers": 1, "vocab_size": V,
            "model_type": "llama", "tie_word_embeddings": False}


def random_tensors(prefix: str, own_embeddings: bool, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape, scale=0.05):
        return torch.randn(*shape, generator=g) * scale

    t = {"fc.weight": r(H, 3 * H), "norm.weight": 1 + r(H, scale=0.2),
         "lm_head.weight": r(VD, H),
         f"{prefix}hidden_norm.weight": 1 + r(H, scale=0.2),
         f"{prefix}input_layernorm.weight": 1 + r(H, scale=0.2),
         f"{prefix}post_attention_layernorm.weight": 1 + r(H, scale=0.2),
         f"{prefix}self_attn.q_proj.weight": r(HEADS * HD, 2 * H),
         f"{prefix}self_attn.k_proj.weight": r(KV * HD, 2 * H),
         f"{prefix}self_attn.v_proj.weight": r(KV * HD, 2 * H),
         f"{prefix}self_attn.o_proj.weight": r(H, HEADS * HD),
         f"{prefix}mlp.gate_proj.weight": r(I, H), f"{prefix}mlp.up_proj.weight": r(I, H),
         f"{prefix}mlp.down_proj.weight": r(H, I)}
    # The draft vocabulary: 32000 distinct target ids, sorted, as the trainers choose them.
    used = torch.randperm(V, generator=g)[:VD].sort().values
    t["d2t"] = used - torch.arange(VD)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[used] = True
    t["t2d"] = t2d
    if own_embeddings:
        t["embed_tokens.weight"] = r(V, H, scale=1.0)
    return t


def write_eagle(path, seed=1):
    """The EAGLE / SpecForge format: a Llama config, midlayer.*, no embeddings."""
    path.mkdir(parents=True)
    cfg = {**layer_config(), "architectures": ["LlamaForCausalLMEagle3"],
           "draft_vocab_size": VD, "torch_dtype": "float16"}
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = random_tensors("midlayer.", False, seed)
    save_file(tensors, str(path / "model.safetensors"))
    return path, tensors


def write_speculators(path, seed=2, ids=(2, 3, 5), norm_before_residual=None):
    """The speculators format: the layer's config nested, layers.0.*, its own embeddings."""
    path.mkdir(parents=True)
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "speculators_version": "0.1.0", "transformer_layer_config": layer_config(),
           "draft_vocab_size": VD, "target_hidden_size": None,
           "eagle_aux_hidden_state_layer_ids": list(ids),
           "speculators_config": {"algorithm": "eagle3", "proposal_methods": [
               {"proposal_type": "greedy", "speculative_tokens": 3}],
               "verifier": {"name_or_path": "target", "architectures": ["LlamaForCausalLM"]}}}
    if norm_before_residual is not None:
        cfg["norm_before_residual"] = norm_before_residual
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = random_tensors("layers.0.", True, seed)
    save_file(tensors, str(path / "model.safetensors"))
    return path, tensors


def reference(t: dict, prefix: str, embed: torch.Tensor, features: list[torch.Tensor],
              tokens: list[int], norm_before_residual: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The head over one whole sequence, from the definition, in float64: features[i] is
    position i's feature ([H]: fc already applied, or a step's own output). Returns
    (h [T, H] before the final norm, logits [T, V] at target ids, -inf off the draft vocab)."""
    w = {k: v.double() for k, v in t.items() if v.is_floating_point()}

    def rms(x, name):
        return w[name] * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    f = torch.stack(features).double()                                   # [T, H]
    e = embed[torch.tensor(tokens)].double()
    hn = rms(f, f"{prefix}hidden_norm.weight")
    x = torch.cat([rms(e, f"{prefix}input_layernorm.weight"), hn], -1)   # embedding first
    n = len(tokens)
    q = (x @ w[f"{prefix}self_attn.q_proj.weight"].T).view(n, HEADS, HD).transpose(0, 1)
    k = (x @ w[f"{prefix}self_attn.k_proj.weight"].T).view(n, KV, HD).transpose(0, 1)
    v = (x @ w[f"{prefix}self_attn.v_proj.weight"].T).view(n, KV, HD).transpose(0, 1)
    inv = 1.0 / 10000.0 ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)  # theta 10000
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()

    def rope(y):
        half = torch.cat([-y[..., HD // 2:], y[..., :HD // 2]], -1)
        return y * cos + half * sin

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(HEADS // KV, 0), v.repeat_interleave(HEADS // KV, 0)
    scores = q @ k.transpose(-1, -2) / HD ** 0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    attn = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, HEADS * HD)
    h = (hn if norm_before_residual else f) + attn @ w[f"{prefix}self_attn.o_proj.weight"].T
    m = rms(h, f"{prefix}post_attention_layernorm.weight")
    gate = m @ w[f"{prefix}mlp.gate_proj.weight"].T
    h = h + (torch.nn.functional.silu(gate) * (m @ w[f"{prefix}mlp.up_proj.weight"].T)) \
        @ w[f"{prefix}mlp.down_proj.weight"].T
    draft = rms(h, "norm.weight") @ w["lm_head.weight"].T                 # [T, VD]
    ids = torch.arange(VD) + t["d2t"]
    logits = torch.full((n, V), float("-inf"), dtype=torch.float64)
    logits[:, ids] = draft
    return h, logits


def served(head: EagleHead, target_features: torch.Tensor, tokens: list[int], steps: list[int]):
    """The head as the engine runs it: a catch-up forward over the positions, then one forward
    a draft step, each feeding the previous output; logits at every position."""
    cache = KVCache(1, 1, 64, KV, HD, torch.float64, torch.device("cpu"))
    n = len(tokens)
    batch = Batch.build([tokens], [0], [0], cache, torch.device("cpu"))
    h = head(batch, head.fc(target_features[None]), cache)
    out, last = [head.target_logits(h, V)[0]], h[:, -1:]
    for j, tok in enumerate(steps):
        step = Batch.build([[tok]], [n + j], [0], cache, torch.device("cpu"))
        last = head(step, last, cache)
        out.append(head.target_logits(last, V)[0])
    return torch.cat(out)


@pytest.mark.parametrize("fmt", ["eagle", "speculators"])
def test_logits_equal_the_formats_definition(tmp_path, target, fmt):
    target64 = target.double()
    if fmt == "eagle":
        path, t = write_eagle(tmp_path / "head")
        prefix, embed, nbr = "midlayer.", target64.model.embed_tokens.weight, False
    else:   # speculators leave norm_before_residual out: vLLM reads it as true
        path, t = write_speculators(tmp_path / "head")
        prefix, embed, nbr = "layers.0.", t["embed_tokens.weight"], True
    head = load_head(path, target64, torch.float64, "cpu")
    assert head.args.norm_before_residual is nbr
    g = torch.Generator().manual_seed(3)
    n, steps = 12, [7, 99999]
    feats = torch.randn(n, 3 * H, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, V, (n,), generator=g).tolist()
    got = served(head, feats, tokens, steps)
    # The reference: real features for the n pairs, then each step's own output as its feature.
    fc = [row for row in feats @ t["fc.weight"].double().T]
    for j in range(len(steps) + 1):
        h, want = reference(t, prefix, embed, fc, tokens + steps[:j], nbr)
        fc.append(h[-1])
    finite = torch.isfinite(want)
    assert finite.sum(-1).eq(VD).all()
    assert torch.equal(torch.isfinite(got), finite)
    assert torch.allclose(got[finite].double(), want[finite], rtol=1e-5, atol=1e-5)
    # The drafted id is a target id in the draft vocabulary
    assert bool(finite[0, int(got[0].argmax())])


def test_residual_variant_changes_the_output(tmp_path, target):
    """norm_before_residual is read, not assumed: the same weights under both settings differ."""
    a, _ = write_speculators(tmp_path / "a", norm_before_residual=False)
    b, _ = write_speculators(tmp_path / "b", norm_before_residual=True)
    feats = torch.randn(5, 3 * H, dtype=torch.float64)
    outs = [served(load_head(p, target.double(), torch.float64, "cpu"), feats, [1, 2, 3, 4, 5],
                   []) for p in (a, b)]
    assert not torch.allclose(outs[0], outs[1])


def target_args(num_layers=32, hidden=4096, vocab=128256):
    return ModelArgs(vocab_size=vocab, hidden_size=hidden, intermediate_size=14336,
                     num_layers=num_layers, num_heads=32, num_kv_heads=8, head_dim=128,
                     rms_norm_eps=1e-5, max_position_embeddings=131072)


def llama31_head_config(**extra):
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
            "vocab_size": 128256, "draft_vocab_size": 32000, **extra}


def test_aux_layer_ids_in_each_formats_convention():
    t = target_args()
    # Without ids: the streams entering layers 2, 16 and 29, i.e. outputs of 1, 15, 28.
    assert head_args(llama31_head_config(), t).aux_layers == (1, 15, 28)
    # SpecForge's ids name layer outputs (SGLang adds one to capture them).
    spec = llama31_head_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 28]})
    assert head_args(spec, t).aux_layers == (1, 15, 28)
    # The speculators' ids name the layer the stream enters (vLLM reads them so).
    layer = {k: v for k, v in llama31_head_config().items()
             if k not in ("architectures", "draft_vocab_size")}
    cfg = {"speculators_model_type": "eagle3", "transformer_layer_config": layer,
           "draft_vocab_size": 32000, "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}
    h = head_args(cfg, t)
    assert h.aux_layers == (1, 15, 28) and h.norm_before_residual and h.format == "speculators"
    assert head_args({**cfg, "norm_before_residual": False}, t).norm_before_residual is False


@pytest.mark.parametrize("change, target_change, message", [
    (dict(hidden_size=2048), {}, "hidden_size 2048 does not fit the target's hidden_size 4096"),
    (dict(target_hidden_size=5120), {}, "target_hidden_size 5120 does not fit"),
    (dict(vocab_size=32000), {}, "vocab_size 32000 does not fit the target's vocab_size 128256"),
    (dict(draft_vocab_size=200000), {}, "draft_vocab_size 200000 must be within 1..128256"),
    (dict(num_hidden_layers=2), {}, "num_hidden_layers 2: only one-layer heads"),
    (dict(tie_word_embeddings=True), {}, "tie_word_embeddings true"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15, 40]}), {},
     "eagle_aux_hidden_state_layer_ids [1, 15, 40] do not name layers of the target's 32"),
    (dict(eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 15]}), {},
     "EAGLE-3 fuses three layers"),
    (dict(norm_output=False), {}, "norm_output False is not served"),
    (dict(fc_norm=True), {}, "fc_norm True is not served"),
    (dict(architectures=["LlamaForCausalLM"]), {}, "not an EAGLE-3 head"),
    ({}, dict(num_layers=6), "needs a target of 8 layers or more, not 6"),
])
def test_heads_that_do_not_fit_are_refused_by_field(change, target_change, message):
    with pytest.raises(CheckpointError, match=message.replace("[", r"\[").replace("]", r"\]")):
        head_args(llama31_head_config(**change), replace(target_args(), **target_change))


def test_speculators_variants_refused_by_field():
    layer = {k: v for k, v in llama31_head_config().items()
             if k not in ("architectures", "draft_vocab_size")}
    base = {"speculators_model_type": "eagle3", "transformer_layer_config": layer}
    for extra, message in [({"speculators_model_type": "eagle"}, "'eagle' is not served"),
                           ({"norm_before_fc": True}, "norm_before_fc True is not served"),
                           ({"transformer_layer_config": None}, "transformer_layer_config is "
                                                                "missing")]:
        with pytest.raises(CheckpointError, match=message):
            head_args({**base, **extra}, target_args())


def test_weights_that_do_not_fit_are_refused(tmp_path, target):
    path, t = write_eagle(tmp_path / "bad")
    save_file({**t, "fc.weight": t["fc.weight"][:, :H].contiguous()}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"fc.weight has shape \(256, 256\)"):
        load_head(path, target, torch.float32, "cpu")
    save_file({k: v for k, v in t.items() if k != "midlayer.hidden_norm.weight"},
              str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing.*hidden_norm"):
        load_head(path, target, torch.float32, "cpu")
    d2t = t["d2t"].clone()
    d2t[-1] = V   # maps past the vocabulary
    save_file({**t, "d2t": d2t}, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="d2t maps draft ids outside"):
        load_head(path, target, torch.float32, "cpu")
    (path / "model.safetensors").unlink()
    (path / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(CheckpointError, match="pickle format"):
        load_head(path, target, torch.float32, "cpu")


def test_written_speculators_head_reloads_equal(tmp_path, target):
    path, t = write_eagle(tmp_path / "eagle")
    head = load_head(path, target, torch.float32, "cpu")
    save_speculators(head, tmp_path / "spec", "meta-llama/Llama-3.1-8B-Instruct")
    cfg = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    assert cfg["speculators_config"]["verifier"]["name_or_path"] == \
        "meta-llama/Llama-3.1-8B-Instruct"
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] >= 1
    assert cfg["transformer_layer_config"]["num_hidden_layers"] == 1
    again = load_head(tmp_path / "spec", target, torch.float32, "cpu")
    assert again.args.aux_layers == head.args.aux_layers
    assert again.args.norm_before_residual == head.args.norm_before_residual
    assert torch.equal(again.d2t, head.d2t)
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), again.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2), n1


def test_captured_layers_equal_transformers_hidden_states(tmp_path):
    """The features a head reads: the target's layer outputs, as transformers returns them
    (hidden_states[i + 1] is layer i's output, for every layer but the last)."""
    path = make_checkpoint(tmp_path / "t", "llama3_gqa_tied", num_hidden_layers=4)
    ours = load_model(path, torch.float64, "cpu")
    ours.capture = (2, 0, 1)
    ref = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    ids = [[3, 14, 15, 92, 65, 35]]
    cache = KVCache(4, 1, 32, 2, 16, torch.float64, torch.device("cpu"))
    out = ours(Batch.build(ids, [0], [0], cache, torch.device("cpu")), cache)
    hs = ref(torch.tensor(ids), output_hidden_states=True).hidden_states
    d = ours.args.hidden_size
    assert out.shape[-1] == 4 * d
    for j, layer in enumerate(ours.capture):
        assert torch.allclose(out[0, :, d * (j + 1): d * (j + 2)], hs[layer + 1][0], atol=1e-10)
