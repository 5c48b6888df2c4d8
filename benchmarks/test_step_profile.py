"""step_profile.py on the CPU at the embedded target's shape (its dry run, as the GPU
checklist's `profile` step runs it at 8B): every row timed, every kind the model runs seen, the
kinds adding up to the eager step, and the GEMMs' bytes a step being the packed weights'."""
import json

from step_profile import KINDS, main


def test_a_step_by_kind_at_two_batches_plain_and_exact(tmp_path, capsys):
    out = tmp_path / "profile.json"
    assert main(["--batches", "1,2", "--context", "24", "--steps", "2",
                 "--kernel-threads", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| target | exact | 2 |" in table and "| target | plain | 1 |" in table
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["batch"]) for r in rows] == [("plain", 1), ("plain", 2),
                                                       ("exact", 1), ("exact", 2)]
    for r in rows:
        ms = r["eager_ms"]
        assert set(ms) <= set(KINDS)
        assert {"GEMM", "attention", "norm", "rotary", "elementwise"} <= set(ms), ms
        assert r["step_ms"] > 0 and r["kernels"] > 100 and r["gemm_gb_s"] > 0
        assert r["weight_bytes"] > 10**6
