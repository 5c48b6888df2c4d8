"""Tiny random Hugging Face checkpoints written with transformers itself: the reference format."""
from __future__ import annotations

from pathlib import Path

import torch
import transformers

BASE = dict(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rms_norm_eps=1e-5, eos_token_id=None, bos_token_id=None, pad_token_id=None)

VARIANTS = {
    "llama2": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=4)),
    "llama3_gqa_tied": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=32))),
    "llama_linear_rope": ("LlamaConfig", "LlamaForCausalLM", dict(
        rope_scaling=dict(rope_type="linear", factor=2.0))),
    "mistral_window": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=8)),
    "qwen2_bias": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "llama_yarn": ("LlamaConfig", "LlamaForCausalLM", dict(rope_parameters=dict(
        rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=32))),
    "qwen3_qk_norm": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        head_dim=16, tie_word_embeddings=True)),
    # layer 0 global, layer 1 a window of 8 (max_window_layers)
    "qwen3_window": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        head_dim=16, use_sliding_window=True, sliding_window=8, max_window_layers=1)),
    # layer 0 a window of 8, layer 1 global; capped scores and logits, a query scale of its own
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(
        head_dim=16, query_pre_attn_scalar=24, sliding_window=8, attn_logit_softcapping=3.0,
        final_logit_softcapping=4.0)),
    # windowed layers with their own RoPE base, linear scaling on the global one
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
        rope_parameters={"full_attention": dict(rope_type="linear", factor=4.0, rope_theta=1e6),
                         "sliding_attention": dict(rope_type="default", rope_theta=10000.0)})),
    # half the head rotates; LongRoPE (short factors below 64 positions, long from there on)
    "phi3_longrope": ("Phi3Config", "Phi3ForCausalLM", dict(
        partial_rotary_factor=0.5, max_position_embeddings=256,
        original_max_position_embeddings=64, rope_parameters=dict(
            rope_type="longrope", rope_theta=10000.0, short_factor=[1.0, 1.3, 1.7, 2.2],
            long_factor=[1.1, 2.0, 3.5, 6.0]))),
    "phi3_window": ("Phi3Config", "Phi3ForCausalLM", dict(sliding_window=8)),
}
# Families whose norm weights are perturbed too (Gemma's are offsets from 1, Qwen3's and
# Gemma 3's q/k norms are per head): a norm left at its initial value would hide a wrong formula.
NOISY_NORMS = {"qwen3_qk_norm", "qwen3_window", "gemma2", "gemma3", "phi3_longrope",
               "phi3_window", "llama_yarn"}


def make_checkpoint(path: Path, variant: str = "llama2", seed: int = 0, **overrides) -> Path:
    config_cls, model_cls, extra = VARIANTS[variant]
    config = getattr(transformers, config_cls)(**{**BASE, **extra, **overrides})
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).to(torch.float32)
    with torch.no_grad():  # random init is near-uniform; sharpen so argmax is rarely a tie
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.3 if "embed" in name or "lm_head" in name else 0.15)
            elif "bias" in name:
                p.normal_(0, 0.1)
            elif "norm" in name and variant in NOISY_NORMS:
                p.add_(torch.randn_like(p) * 0.2)
    model.save_pretrained(path)
    return path


def make_draft(target: Path, path: Path, noise: float, seed: int = 1) -> Path:
    """A draft that agrees with the target often but not always: its weights plus noise."""
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * noise * p.std())
    model.save_pretrained(path)
    return path
