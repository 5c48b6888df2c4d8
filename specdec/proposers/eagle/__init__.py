"""EAGLE-3 heads (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large Language
Models via Training-Time Test"): a one-layer decoder that drafts from the target's own hidden
states, served in the target's process so that the call verifying round r drafts round r + 1.

- config.py: both published checkpoint formats, read into one HeadArgs.
- head.py: the head's forward over its own one-layer KV slot pool.
- drafting.py: catch-up on the newly committed positions and k draft steps, for a batch.
- checkpoint.py: loading either format, writing the speculators one.
"""
