"""Medusa-1 heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads"): K heads on the target's last hidden state, each guessing one token
further ahead, served in the target's process so that the call verifying round r drafts round
r + 1's k tokens at once.

- config.py: FasterDecoding's config.json read into MedusaArgs, checked against the target.
- head.py: the heads' forward, hidden state -> [K, V] logits.
- checkpoint.py: loading and writing FasterDecoding's layout (medusa_lm_head.safetensors).
"""
