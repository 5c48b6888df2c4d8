"""The CPU's own kernels, in C, built at load for the machine that runs them.

On the CPU a decode step is bound by reading the weights, and PyTorch's kernels neither read them
at the memory's rate at few rows nor attend over a slot pool without masks and gathers. The
kernels here do both, and each computes a row (a query) the same way whatever else its call holds,
so the exact mode (specdec/kernels/invariant.py) costs nothing extra on the CPU:

- linear.c / linear.py: y = x W^T over weights packed once at load (float32, bfloat16);
- attention.c / attention.py: the KV write and each query's attention over its slot in place;
- pointwise.c / pointwise.py: the residual add with its RMSNorm, and SiLU(gate) x up;
- vec.h: their vectors (GCC's portable vector extensions) and bfloat16's rounding;
- pool.c: the threads that share a call's items (work stealing);
- build.py: one shared library from the C sources, compiled with the system's C compiler into a
  cache and loaded with ctypes, checked at load; where it cannot be, the engine keeps PyTorch's
  operators and says why.

Imports nothing from the rest of specdec: the engine packs the model at load (linear.pack_model)
and hands pointwise.py to Transformer.fuse_pointwise; model.py's modules and attention.attend
call in.
"""
