"""Write a Hugging Face-format target/draft pair with random weights at real model shapes.

For measuring the cost side of speculative decoding at production sizes without downloading
weights: per-pass times of target and draft, their ratio c, the round split, memory. With random
weights the draft does not predict the target, so acceptance (and therefore the speedup) is NOT
meaningful; benchmarks/bench.py still reports them, read only c and the timings. Also the
real-shape checkpoints of every supported family that the tests load.

    .venv/bin/python benchmarks/make_random_pair.py --out /models/random-8b-1b
    .venv/bin/python benchmarks/make_random_pair.py --out /tmp/rp --scale 0.0625   # a small test
    .venv/bin/python benchmarks/make_random_pair.py --out /tmp/q3 --target qwen3-8b \
        --draft qwen3-0.6b --scale 0.125
    .venv/bin/python benchmarks/make_random_pair.py --out /tmp/rp --head   # + OUT/eagle

Presets (`--target`/`--draft`) are the published config.json values of: llama-8b
(Llama-3.1-8B), llama-70b (Llama-3.1-70B), llama-1b (Llama-3.2-1B), qwen3-8b, qwen3-0.6b,
gemma2-9b, gemma2-2b (Gemma 2), gemma3-12b (Gemma 3 12B's language model, as a text-only
checkpoint), gemma3-1b, gemma3-270m, phi4-mini (Phi-4-mini-instruct), phi3-mini
(Phi-3-mini-4k-instruct), smollm2-360m and smollm2-135m (SmolLM2, the small Llama-architecture
chat models CPU engines are compared on); vocabularies, head sizes, grouped KV heads, tied
embeddings, RoPE scaling, sliding windows and soft caps included. `--scale s` multiplies the
layer count, the heads (head_dim and the query/KV grouping kept), the width and the MLP width by
s, for tests on small machines; the vocabulary stays real unless --vocab-size says otherwise.
Weights are bfloat16 safetensors, sharded at --shard-gb with a model.safetensors.index.json (the
full 8B target is about 16 GB on disk, the 1B draft about 2.5 GB); each tensor is generated and
written shard by shard, so memory stays near one shard. The tensor names and shapes are those
transformers' own model class has for the config.

The tokenizer files are copied from --tokenizer-from (default the embedded models/default/target):
its ids (4096 of them) are all valid inputs; ids the model emits beyond them decode to nothing,
so the generated text is mostly empty while token counts and timings are exact. `--readable`
zeroes the output rows of those ids (the LM head, or the tied embeddings, whose rows past the
tokenizer are never an input): greedy output then decodes to text, the shapes stay real.

`--head` also writes OUT/eagle: an EAGLE-3 head for the target in the speculators format, at the
shape the published heads have (for Llama-3.1-8B: one layer at the target's width whose
attention reads 2 x 4096, the target's MLP width, a 32000-id draft vocabulary, the target's
embeddings), random weights: its costs are real, its acceptance is not.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

from inputs import DEFAULT_TARGET


LLAMA3_ROPE = dict(rope_type="llama3", low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=8192)
# LongRoPE factors of Phi-4-mini-instruct's shape (48 each: 96 of its 128 head dims rotate): a
# ramp from 1, not the release's values, which random weights would not make more meaningful.
PHI4_FACTORS = [round(1.08 ** i, 4) for i in range(48)]
# What Gemma 2's releases share.
GEMMA2 = dict(model_type="gemma2", vocab_size=256000, head_dim=256, max_position_embeddings=8192,
              query_pre_attn_scalar=256, sliding_window=4096, attn_logit_softcapping=50.0,
              final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
              rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=True)
# What Gemma 3's text releases share (the 1B's and 270M's window, context and vocabulary).
GEMMA3 = dict(model_type="gemma3_text", vocab_size=262144, head_dim=256,
              max_position_embeddings=32768, query_pre_attn_scalar=256, sliding_window=512,
              sliding_window_pattern=6, rope_theta=1000000.0, rope_local_base_freq=10000.0,
              hidden_activation="gelu_pytorch_tanh", rms_norm_eps=1e-6, tie_word_embeddings=True)
PRESETS = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-8b": dict(model_type="llama", hidden_size=4096, num_hidden_layers=32,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336,
                     vocab_size=128256, head_dim=128, max_position_embeddings=131072,
                     rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
                     rms_norm_eps=1e-5, tie_word_embeddings=False),
    # meta-llama/Llama-3.1-70B(-Instruct) config.json: the target that needs tensor parallelism
    # (about 141 GB in bf16; benchmarks/tp_costs.py builds it on the GPUs, no checkpoint)
    "llama-70b": dict(model_type="llama", hidden_size=8192, num_hidden_layers=80,
                      num_attention_heads=64, num_key_value_heads=8, intermediate_size=28672,
                      vocab_size=128256, head_dim=128, max_position_embeddings=131072,
                      rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=8.0),
                      rms_norm_eps=1e-5, tie_word_embeddings=False),
    # meta-llama/Llama-3.2-1B config.json
    "llama-1b": dict(model_type="llama", hidden_size=2048, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192,
                     vocab_size=128256, head_dim=64, max_position_embeddings=131072,
                     rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE, factor=32.0),
                     rms_norm_eps=1e-5, tie_word_embeddings=True),
    # HuggingFaceTB/SmolLM2-360M(-Instruct) and SmolLM2-135M(-Instruct) config.json: small
    # Llama-architecture chat models (tied embeddings, grouped KV heads) that CPU serving
    # engines are compared on
    "smollm2-360m": dict(model_type="llama", hidden_size=960, num_hidden_layers=32,
                         num_attention_heads=15, num_key_value_heads=5, intermediate_size=2560,
                         vocab_size=49152, head_dim=64, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         vocab_size=49152, head_dim=64, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True),
    # Qwen/Qwen3-8B and Qwen/Qwen3-0.6B config.json (q/k norms; 0.6B: 16 heads of 128 > 1024)
    "qwen3-8b": dict(model_type="qwen3", hidden_size=4096, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, intermediate_size=12288,
                     vocab_size=151936, head_dim=128, max_position_embeddings=40960,
                     rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     use_sliding_window=False, max_window_layers=36),
    "qwen3-0.6b": dict(model_type="qwen3", hidden_size=1024, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, intermediate_size=3072,
                       vocab_size=151936, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
                       use_sliding_window=False, max_window_layers=28),
    # google/gemma-2-9b and gemma-2-2b config.json (alternating 4096-token windows, soft caps)
    "gemma2-9b": dict(GEMMA2, hidden_size=3584, num_hidden_layers=42, num_attention_heads=16,
                      num_key_value_heads=8, intermediate_size=14336),
    "gemma2-2b": dict(GEMMA2, hidden_size=2304, num_hidden_layers=26, num_attention_heads=8,
                      num_key_value_heads=4, intermediate_size=9216),
    # google/gemma-3-12b-it's text_config and google/gemma-3-1b-it (five windowed layers per
    # global one; local RoPE base 10k, global 1M with linear scaling x8 on 12B). The 12B release
    # is an image-text checkpoint whose language model has this shape and vocabulary 262208.
    "gemma3-12b": dict(GEMMA3, hidden_size=3840, num_hidden_layers=48, num_attention_heads=16,
                       num_key_value_heads=8, intermediate_size=15360, vocab_size=262208,
                       max_position_embeddings=131072, sliding_window=1024,
                       rope_scaling=dict(rope_type="linear", factor=8.0)),
    "gemma3-1b": dict(GEMMA3, hidden_size=1152, num_hidden_layers=26, num_attention_heads=4,
                      num_key_value_heads=1, intermediate_size=6912),
    # google/gemma-3-270m: the family's smallest draft, its embedding half the 1B's
    "gemma3-270m": dict(GEMMA3, hidden_size=640, num_hidden_layers=18, num_attention_heads=4,
                        num_key_value_heads=1, intermediate_size=2048),
    # microsoft/Phi-4-mini-instruct (fused qkv and gate_up, 3/4 of each head rotates, LongRoPE)
    # and microsoft/Phi-3-mini-4k-instruct (a 2047-token window on every layer)
    "phi4-mini": dict(model_type="phi3", hidden_size=3072, num_hidden_layers=32,
                      num_attention_heads=24, num_key_value_heads=8, intermediate_size=8192,
                      vocab_size=200064, max_position_embeddings=131072,
                      original_max_position_embeddings=4096, partial_rotary_factor=0.75,
                      rope_theta=10000.0, rope_scaling=dict(
                          type="longrope", short_factor=[1.0] * 48, long_factor=PHI4_FACTORS),
                      rms_norm_eps=1e-5, sliding_window=262144, tie_word_embeddings=True),
    "phi3-mini": dict(model_type="phi3", hidden_size=3072, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=32, intermediate_size=8192,
                      vocab_size=32064, max_position_embeddings=4096,
                      original_max_position_embeddings=4096, rope_theta=10000.0,
                      rms_norm_eps=1e-5, sliding_window=2047, tie_word_embeddings=False),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt")


def head_dim(cfg: dict) -> int:
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def scaled(preset: dict, scale: float, vocab_size: int | None) -> dict:
    """The preset with depth, heads, width and MLP width multiplied by `scale` (head_dim and
    the query heads per KV head kept; the width keeps its ratio to heads x head_dim)."""
    cfg = dict(preset)
    if scale != 1.0:
        if not 0 < scale <= 1:
            raise SystemExit("--scale must be in (0, 1]")
        d = head_dim(cfg)
        group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
        kv = max(1, round(cfg["num_key_value_heads"] * scale))
        heads = kv * group
        width = cfg["hidden_size"] / (cfg["num_attention_heads"] * d)
        cfg.update(num_hidden_layers=max(1, round(cfg["num_hidden_layers"] * scale)),
                   num_key_value_heads=kv, num_attention_heads=heads, head_dim=d,
                   hidden_size=max(8, 8 * round(heads * d * width / 8)),
                   intermediate_size=max(8, 8 * round(cfg["intermediate_size"] * scale / 8)))
        if "max_window_layers" in cfg:
            cfg["max_window_layers"] = cfg["num_hidden_layers"]
    if vocab_size:
        cfg["vocab_size"] = vocab_size
    return cfg


def hf_config(cfg: dict, **ids):
    """transformers' config object for `cfg` (model_type picks the class)."""
    from transformers import AutoConfig

    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    return AutoConfig.for_model(cfg["model_type"], **fields, **ids)


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The state dict transformers' model class has for `cfg`, in order (built on the meta
    device: no memory), without lm_head when the embeddings are tied."""
    from transformers import AutoModelForCausalLM

    config = hf_config(cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    out = [(name, tuple(t.shape)) for name, t in model.state_dict().items()
           if not name.endswith("inv_freq")]
    if config.tie_word_embeddings:
        out = [(n, s) for n, s in out if n != "lm_head.weight"]
    return out


def architecture(cfg: dict) -> str:
    """The class name config.json's `architectures` lists (LlamaForCausalLM, ...)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg["model_type"]]


def write_model(out: Path, cfg: dict, tokenizer_from: Path, seed: int, shard_bytes: int,
                eos: int | None, bos: int | None, readable: int | None = None,
                device: str = "cpu") -> int:
    """readable: zero the output rows of ids from this one on (see --readable). device: where
    the numbers are drawn (the same seed draws other numbers on a GPU)."""
    from safetensors.torch import save_file
    from transformers import GenerationConfig

    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.safetensors")) + [out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    config = hf_config(cfg, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos,
                       dtype="bfloat16")
    config.architectures = [architecture(cfg)]
    config.save_pretrained(out)
    GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=eos).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy2(tokenizer_from / name, out / name)

    gen = torch.Generator(device).manual_seed(seed)
    shapes = tensor_shapes(cfg)
    total = sum(torch.Size(s).numel() for _, s in shapes) * 2
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    weight_map: dict[str, str] = {}
    files: list[str] = []

    def flush(last: bool) -> None:
        nonlocal size
        if not shards[-1]:
            return
        files.append(f"part-{len(files) + 1:05d}.safetensors")
        save_file(shards[-1], str(out / files[-1]), metadata={"format": "pt"})
        os.chmod(out / files[-1], 0o644)
        for k in shards[-1]:
            weight_map[k] = files[-1]
        print(f"  {out.name}: wrote {files[-1]} ({size / 2**30:.2f} GiB)", file=sys.stderr,
              flush=True)
        shards[-1], size = {}, 0

    gemma = cfg["model_type"].startswith("gemma")
    output = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
    for name, shape in shapes:
        if len(shape) == 1:   # RMSNorm weights: Gemma's scale by (1 + w)
            t = (torch.zeros if gemma else torch.ones)(shape, dtype=torch.bfloat16)
        else:
            t = torch.empty(shape, dtype=torch.float32, device=device).normal_(
                0.0, 0.02, generator=gen)
            if readable is not None and name == output:
                t[readable:] = 0
            t = t.to(torch.bfloat16).cpu()
        n = t.numel() * 2
        if size and size + n > shard_bytes:
            flush(False)
        shards[-1][name] = t
        size += n
    flush(True)
    # Rename to the usual model-0000i-of-0000n names and write the index.
    final = {f: f"model-{j + 1:05d}-of-{len(files):05d}.safetensors" for j, f in enumerate(files)}
    if len(files) == 1:
        final = {files[0]: "model.safetensors"}
    for f, g in final.items():
        (out / f).rename(out / g)
    if len(files) > 1:
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total},
             "weight_map": {k: final[f] for k, f in weight_map.items()}}, indent=2) + "\n")
    return total


def write_head(out: Path, target: Path, seed: int) -> int:
    """A random-weight EAGLE-3 head for the checkpoint in `target`, as `specdec distill --method
    eagle3` shapes one by default (its draft vocabulary: the first ids). Returns its bytes."""
    from specdec.runtime.config import ModelArgs
    from specdec.distill.eagle3 import default_draft_vocab, head_layer_args, initialised_head
    from specdec.proposers.eagle.checkpoint import save_speculators
    from specdec.proposers.eagle.config import SPECULATORS, HeadArgs, default_aux_layers

    t = ModelArgs.from_dir(target)
    aux = default_aux_layers(t.num_layers) if t.num_layers >= 8 else (0, t.num_layers // 2,
                                                                       t.num_layers - 1)
    h = HeadArgs(head_layer_args(t), default_draft_vocab(t.vocab_size), t.hidden_size, aux,
                 False, SPECULATORS)
    head = initialised_head(h, torch.device("cpu"), seed)   # its embedding is the target's
    head.d2t = torch.zeros(h.draft_vocab_size, dtype=torch.int64)
    save_speculators(head, out, str(target), dtype=torch.bfloat16, embeddings=False,
                     verifier_architectures=json.loads(
                         (target / "config.json").read_text()).get("architectures"))
    return (out / "model.safetensors").stat().st_size


def tokenizer_size(path: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(path, local_files_only=True))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="writes OUT/target and OUT/draft")
    ap.add_argument("--target", choices=sorted(PRESETS), default="llama-8b")
    ap.add_argument("--draft", choices=sorted(PRESETS), default="llama-1b")
    ap.add_argument("--scale", type=float, default=1.0,
                    help="multiply layers, heads and MLP width by this (0 < s <= 1)")
    ap.add_argument("--vocab-size", type=int, help="override the presets' 128256")
    ap.add_argument("--tokenizer-from", type=Path, default=DEFAULT_TARGET)
    ap.add_argument("--readable", action="store_true",
                    help="zero the output rows of ids past the copied tokenizer's")
    ap.add_argument("--head", action="store_true",
                    help="also write OUT/eagle, an EAGLE-3 head for the target (random weights)")
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu",
                    help="where the numbers are drawn: cuda draws an 8B pair's in seconds, not "
                         "the CPU's minute (the same seed draws other numbers there)")
    args = ap.parse_args(argv)
    if not (args.tokenizer_from / "tokenizer.json").is_file() and not (
            args.tokenizer_from / "tokenizer.model").is_file():
        raise SystemExit(f"{args.tokenizer_from}: no tokenizer.json / tokenizer.model to copy")
    tok_cfg = {}
    if (args.tokenizer_from / "config.json").is_file():
        tok_cfg = json.loads((args.tokenizer_from / "config.json").read_text())
    eos = tok_cfg.get("eos_token_id")
    bos = tok_cfg.get("bos_token_id", eos)
    t0 = time.monotonic()
    meta = {"note": "random weights: only costs (per-pass times, c, memory) are meaningful; "
                    "acceptance is not", "seed": args.seed, "scale": args.scale,
            "tokenizer_from": str(args.tokenizer_from), "drawn_on": args.device}
    live = tokenizer_size(args.tokenizer_from) if args.readable else None
    for role, preset, seed in (("target", args.target, args.seed),
                               ("draft", args.draft, args.seed + 1)):
        cfg = scaled(PRESETS[preset], args.scale, args.vocab_size)
        size = write_model(args.out / role, cfg, args.tokenizer_from, seed,
                           int(args.shard_gb * 2**30), eos, bos, live, args.device)
        meta[role] = {"preset": preset, "bytes": size, "params": size // 2,
                      **{k: cfg[k] for k in ("hidden_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads",
                                             "intermediate_size", "vocab_size")}}
        print(f"{args.out / role}: {preset} x{args.scale}, {size / 2 / 1e9:.3f} B params, "
              f"{size / 2**30:.2f} GiB bf16", file=sys.stderr, flush=True)
    if args.head:
        size = write_head(args.out / "eagle", args.out / "target", args.seed + 2)
        meta["eagle"] = {"bytes": size}
        print(f"{args.out / 'eagle'}: EAGLE-3 head, {size / 2**30:.2f} GiB bf16", file=sys.stderr,
              flush=True)
    (args.out / "random_pair.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"done in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
