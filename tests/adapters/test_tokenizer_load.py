"""specdec.serving.tokenizer.load_tokenizer: in a Triton stub, pre/postprocessing load the
tokenizer without importing torch, and it encodes and decodes as the ordinary load does."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "default" / "target"
TEXT = "def add(a, b):\n    return a + b  # ünïcode"

SCRIPT = f"""
import json, sys, types
if sys.argv[1] == "stub":   # what the Triton Python backend stub has imported at start
    sys.modules["c_python_backend_utils"] = types.ModuleType("c_python_backend_utils")
from specdec.serving.tokenizer import decode_ids, encode_prompt, in_triton_stub, load_tokenizer
tok = load_tokenizer({str(TARGET)!r}, torch_free=in_triton_stub())   # as pre/postprocessing
ids = encode_prompt(tok, {TEXT!r})
print(json.dumps(dict(torch=sys.modules.get("torch", "absent") is not None, ids=ids,
                      text=decode_ids(tok, ids))))
"""


def run(where: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, where], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_a_stub_loads_the_tokenizer_without_torch_and_it_works_the_same():
    stub, plain = run("stub"), run("plain")
    assert not stub["torch"] and plain["torch"]   # elsewhere transformers imports torch
    assert stub["ids"] == plain["ids"] and len(stub["ids"]) > 5
    assert stub["text"] == plain["text"]
