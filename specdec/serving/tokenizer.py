"""The tokenizer of preprocessing and postprocessing, loaded without running any code.

A checkpoint directory is data, never a program: `trust_remote_code` stays off, so a
tokenizer_config.json whose `auto_map` names a Python file is refused (or its class is taken
from transformers itself), never imported; and nothing is fetched from a hub.
"""
from __future__ import annotations


def load_tokenizer(path: str):
    from transformers import AutoTokenizer   # the serve extra; imported where it is needed
    return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
