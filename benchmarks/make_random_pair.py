"""Write a Hugging Face-format target/draft pair with random weights at real model shapes.

For measuring the cost side of speculative decoding at production sizes without downloading
weights: per-pass times of target and draft, their ratio c, the round split, memory. With random
weights the draft does not predict the target, so acceptance (and therefore the speedup) is NOT
meaningful; benchmarks/bench.py still reports them, read only c and the timings.

    .venv/bin/python benchmarks/make_random_pair.py --out /models/random-8b-1b
    .venv/bin/python benchmarks/make_random_pair.py --out /tmp/rp --scale 0.0625   # a small test

Presets (`--target`/`--draft`): llama-8b is Llama-3.1-8B's shape (hidden 4096, 32 layers, 32
heads, 8 KV heads, intermediate 14336, vocab 128256, llama3 RoPE scaling); llama-1b is
Llama-3.2-1B's (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab 128256,
tied embeddings). `--scale s` multiplies the layer count, the heads (head_dim kept) and the MLP
width by s, for tests on small machines. Weights are bfloat16 safetensors, sharded at
--shard-gb with a model.safetensors.index.json (the full 8B target is about 16 GB on disk, the
1B draft about 2.5 GB); each tensor is generated and written shard by shard, so memory stays
near one shard. The tokenizer files are copied from --tokenizer-from (default the embedded
models/default/target): its ids (4096 of them) are all valid inputs; ids the model emits beyond
them decode to nothing, so the generated text is mostly empty while token counts and timings
are exact.
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

PRESETS = {
    # meta-llama/Llama-3.1-8B config.json
    "llama-8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
                     head_dim=128, max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling=dict(LLAMA3_ROPE, factor=8.0), rms_norm_eps=1e-5,
                     tie_word_embeddings=False),
    # meta-llama/Llama-3.2-1B config.json
    "llama-1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
                     head_dim=64, max_position_embeddings=131072, rope_theta=500000.0,
                     rope_scaling=dict(LLAMA3_ROPE, factor=32.0), rms_norm_eps=1e-5,
                     tie_word_embeddings=True),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "tokenizer.model", "vocab.json", "merges.txt")


def scaled(preset: dict, scale: float, vocab_size: int | None) -> dict:
    """The preset with depth, heads and MLP width multiplied by `scale` (head_dim kept)."""
    cfg = dict(preset)
    if scale != 1.0:
        if not 0 < scale <= 1:
            raise SystemExit("--scale must be in (0, 1]")
        group = cfg["num_attention_heads"] // cfg["num_key_value_heads"]
        kv = max(1, round(cfg["num_key_value_heads"] * scale))
        heads = kv * max(1, round(group * min(1.0, scale * cfg["num_key_value_heads"] / kv)))
        cfg.update(num_hidden_layers=max(1, round(cfg["num_hidden_layers"] * scale)),
                   num_key_value_heads=kv, num_attention_heads=heads,
                   hidden_size=heads * cfg["head_dim"],
                   intermediate_size=max(8, 8 * round(cfg["intermediate_size"] * scale / 8)))
    if vocab_size:
        cfg["vocab_size"] = vocab_size
    return cfg


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    """LlamaForCausalLM's state dict, in order."""
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (v, h))]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [(p + "input_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (q, h)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.o_proj.weight", (h, q)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "mlp.gate_proj.weight", (i, h)),
                (p + "mlp.up_proj.weight", (i, h)),
                (p + "mlp.down_proj.weight", (h, i))]
    out.append(("model.norm.weight", (h,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (v, h)))
    return out


def write_model(out: Path, cfg: dict, tokenizer_from: Path, seed: int, shard_bytes: int,
                eos: int | None, bos: int | None) -> int:
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig

    out.mkdir(parents=True, exist_ok=True)
    for old in list(out.glob("*.safetensors")) + [out / "model.safetensors.index.json"]:
        old.unlink(missing_ok=True)
    config = LlamaConfig(**cfg, bos_token_id=bos, eos_token_id=eos, pad_token_id=eos,
                         torch_dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    config.save_pretrained(out)
    GenerationConfig(bos_token_id=bos, eos_token_id=eos, pad_token_id=eos).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).is_file():
            shutil.copy2(tokenizer_from / name, out / name)

    gen = torch.Generator().manual_seed(seed)
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

    for name, shape in shapes:
        if len(shape) == 1:
            t = torch.ones(shape, dtype=torch.bfloat16)   # RMSNorm weights
        else:
            t = torch.empty(shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen)
            t = t.to(torch.bfloat16)
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
    ap.add_argument("--shard-gb", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
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
            "tokenizer_from": str(args.tokenizer_from)}
    for role, preset, seed in (("target", args.target, args.seed),
                               ("draft", args.draft, args.seed + 1)):
        cfg = scaled(PRESETS[preset], args.scale, args.vocab_size)
        size = write_model(args.out / role, cfg, args.tokenizer_from, seed,
                           int(args.shard_gb * 2**30), eos, bos)
        meta[role] = {"preset": preset, "bytes": size, "params": size // 2,
                      **{k: cfg[k] for k in ("hidden_size", "num_hidden_layers",
                                             "num_attention_heads", "num_key_value_heads",
                                             "intermediate_size", "vocab_size")}}
        print(f"{args.out / role}: {preset} x{args.scale}, {size / 2 / 1e9:.3f} B params, "
              f"{size / 2**30:.2f} GiB bf16", file=sys.stderr, flush=True)
    (args.out / "random_pair.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(f"done in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
