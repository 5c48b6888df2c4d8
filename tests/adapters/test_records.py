"""specdec.records: the shared types load no torch, and its names travel as their strings."""
import json
import subprocess
import sys

from specdec.records import DRAFTING, Finish, Off, Proposer, Request

# Modules that run where no model is loaded (the orchestrator, pre/postprocessing, the gateway)
# or that only need the loop's types.
TORCH_FREE = ("specdec.records", "specdec.proposers.ngram", "specdec.planning.policy",
              "specdec.decoding.loop",
              "specdec.serving.orchestrator", "specdec.serving.adapter",
              "specdec.serving.requests", "specdec.serving.calls", "specdec.serving.bls",
              "specdec.serving.metrics", "specdec.openai.app", "specdec.openai.triton")


def test_modules_without_a_model_import_no_torch():
    code = (f"import sys\nfor m in {TORCH_FREE!r}:\n    __import__(m)\n"
            f"    if 'torch' in sys.modules:\n        print(m)\n        break\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "", f"importing {out} loads torch"


def test_names_are_their_strings():
    assert [str(p) for p in Proposer] == ["draft", "ngram", "suffix", "eagle", "self", "medusa",
                                         "hybrid"]
    assert DRAFTING == ("draft", "ngram", "eagle", "self", "medusa", "suffix")
    assert f"{Finish.EOS}/{Off.LOAD_CAP}" == "eos/load_cap"
    assert json.dumps({Proposer.NGRAM: Finish.CANCELLED}) == '{"ngram": "cancelled"}'
    # Counters keyed by enum members are found by the plain strings other code passes.
    assert {Finish.ERROR: 1}["error"] == 1 and Proposer("eagle") is Proposer.EAGLE
    assert Finish.ERROR.encode() == b"error"
    assert Request([1], 4, 2).proposer == "draft"
