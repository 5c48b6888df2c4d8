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
}


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
