"""Every entry point benchmarks/README.md lists answers --help: its imports resolve and its
arguments parse, so a command the docs give does not fail before it starts."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
LISTED = sorted(set(re.findall(r"\b([a-z_]+\.py)\b", (HERE / "README.md").read_text()))
                - {"test_entry_points.py"})
LIBRARY = {"inputs.py", "server.py", "clients.py", "engine_runs.py", "hf_runs.py",
           "triton_runs.py", "figures.py", "machine.py", "report.py", "progress.py",
           "model_sizes.py", "pyspy.py", "sim_plan.py", "sim_inproc.py", "sim_served.py",
           "sim_report.py"}
ENTRY_POINTS = [f for f in LISTED if f not in LIBRARY and (HERE / f).exists()]


def test_the_readme_lists_every_script():
    scripts = {p.name for p in HERE.glob("*.py") if not p.name.startswith("test_")}
    assert scripts - set(LISTED) == set()
    assert len(ENTRY_POINTS) >= 20


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_help(script):
    out = subprocess.run([sys.executable, str(HERE / script), "--help"], capture_output=True,
                         text=True, timeout=120, cwd=HERE.parent)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage" in out.stdout.lower() or "--help" in out.stdout, out.stdout[:500]
