"""A bad checkpoint path fails the real server at load, with a message naming the path."""
import os
import subprocess
import sys

from tests.e2e.conftest import ROOT, _free_port


def test_missing_model_directory_fails_the_load_naming_it(tmp_path):
    missing = tmp_path / "no-such-checkpoint"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SPECDEC_")},
           "SPECDEC_DRAFT_MODEL": str(missing)}
    proc = subprocess.run(
        [sys.executable, "-m", "specdec.launcher.launch", f"--http-port={_free_port()}",
         f"--grpc-port={_free_port()}", f"--metrics-port={_free_port()}",
         "--exit-timeout-secs=1"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "failed to load 'draft_model'" in log
    assert f"{missing}: model directory does not exist" in log
