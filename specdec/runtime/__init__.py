"""The engine: one model and its KV slot pool, the draft's `propose` and the target's `verify`.

engine.py holds Engine; the rest is what it computes with: the transformer (model.py,
attention.py, batch.py), its caches (kv_cache.py), weights and configs (weights.py, config.py),
CUDA graphs (graphs.py), sampling and the verification rule (sampling.py, verify.py,
logprobs.py), the draft's k steps and a PARD draft's one pass (draft_steps.py,
parallel_drafts.py), the interface of drafters in the target's process (in_target.py), and
tensor parallelism (tensor_parallel/).

May import: records.py, kernels/, and its own modules; nothing of the proposers, the planning,
the decoding loop, serving or the launcher (tests/test_import_graph.py).
"""
