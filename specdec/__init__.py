"""Speculative decoding core: pure PyTorch + NumPy, no Triton import.

Draft-model speculative decoding (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding"; Chen et al. 2023, "Accelerating Large Language Model Decoding with
Speculative Sampling"): a small draft model proposes K tokens, the target scores all K in one
forward pass, and rejection sampling keeps exactly the target's output distribution.
"""
