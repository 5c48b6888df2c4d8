"""The arithmetic below the engine: batch-invariant matrix products and attention for exact
mode (invariant*.py), their Triton kernels (triton_kernels.py), and the CPU's C kernels (cpu/).

May import: nothing else of specdec.
"""
