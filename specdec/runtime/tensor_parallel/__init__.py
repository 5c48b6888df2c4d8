"""Tensor parallelism over PyTorch's distributed runtime: a rank's slice of the model
(parallel.py, sharded_weights.py), rank 0 leading the others through every engine call
(parallel_engine.py), and their processes (parallel_launch.py, parallel_worker.py).

May import: the engine (specdec/runtime/) and records.py.
"""
