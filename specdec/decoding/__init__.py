"""The speculative loop: one round of choose, propose, verify, commit, emit (loop.py), the
batching of concurrent sequences' calls (batching.py), the papers' step it is held to
(reference.py), and an in-process drafter and verifier over an engine (local.py).

May import: records.py, proposers/, planning/, and the engine (local.py, reference.py); loop.py
imports no torch.
"""
