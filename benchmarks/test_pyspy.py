"""pyspy.py's summary of py-spy's raw (folded) stacks."""
from pyspy import top


def test_top_counts_innermost_and_nearest_specdec_frames(tmp_path):
    raw = tmp_path / "run--speculative_decoding.txt"
    raw.write_text(
        "run (threading.py:1);Engine.verify (specdec/runtime/engine.py:194) 6\n"
        "run (threading.py:1);Engine.propose (specdec/runtime/engine.py:170);"
        "draft_steps (specdec/runtime/draft_steps.py:65) 3\n"
        "run (threading.py:1);Courier._run (specdec/serving/courier.py:58);"
        "wait (threading.py:355) 1\n")
    out = top(raw).splitlines()
    assert out[0] == "run--speculative_decoding.txt: 10 samples"
    inner = out[out.index("  by innermost frame:") + 1:out.index("  by nearest specdec frame:")]
    assert inner[0].split() == ["60.0", "%", "Engine.verify", "(specdec/runtime/engine.py:194)"]
    assert inner[-1].split()[-2:] == ["wait", "(threading.py:355)"]
    nearest = out[out.index("  by nearest specdec frame:") + 1:]
    assert nearest[2].split()[:3] == ["10.0", "%", "Courier._run"]
