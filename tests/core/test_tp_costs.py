"""benchmarks/tp_costs.py: the llama-70b preset is Llama-3.1-70B's size, and the benchmark runs
end to end on the CPU (gloo, two processes) at a tiny scale, as its GPU run will at full size."""
from __future__ import annotations

import json
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import tp_costs  # noqa: E402


def preset(**over) -> Namespace:
    return Namespace(**{"preset": "llama-70b", "scale": 1.0, "vocab_size": None, "layers": None,
                        **over})


def test_the_70b_preset_has_llama_3_1_70b_parameters():
    full = tp_costs.model_args(preset())
    weights = tp_costs.rank_bytes(full, torch.bfloat16, 1, 1, 1) - 2 * full.num_layers * \
        full.num_kv_heads * full.head_dim * 2   # less one token of KV
    assert abs(weights / 2 - 70.55e9) < 0.01e9    # 70.55 B parameters, untied
    # a quarter of every matrix per rank at degree 4, the norms whole on each
    quarter = tp_costs.rank_bytes(full, torch.bfloat16, 4, 1, 1)
    assert weights / 4 < quarter < weights / 4 * 1.01
    assert tp_costs.model_args(preset(layers=20)).num_layers == 20


def test_a_dry_run_on_the_cpu_at_degrees_one_and_two(tmp_path):
    out = tmp_path / "tp.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "tp_costs.py"), "--degrees", "1,2,3",
         "--scale", "0.0625", "--vocab-size", "4096", "--layers", "2", "--batches", "1",
         "--ks", "1,3", "--calls", "2", "--warmup", "1", "--context", "16", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(out.read_text())["degrees"]
    assert "not divisible by the tensor-parallel degree 3" in r["3"]["skipped"]
    one, two = r["1"]["batches"]["1"], r["2"]["batches"]["1"]
    assert r["2"]["rank_bytes"] < r["1"]["rank_bytes"]
    for row in (one, two):
        assert row["step_ms"] > 0 and set(row["verify_ms"]) == {"1", "3"}
    assert "collective_share_step" not in one
    assert two["all_reduce_ms"] > 0 and two["all_reduces_per_forward"] == 5
    assert two["collective_share_step"] < 1 and set(two["collective_share_verify"]) == {"1", "3"}
    assert "| 2 | 1 |" in done.stdout
