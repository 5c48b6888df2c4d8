"""Triton-free helpers behind the model.py adapters: settings, request parsing, BLS glue.

Nothing here imports triton_python_backend_utils; the BLS glue receives it as an argument.
"""
