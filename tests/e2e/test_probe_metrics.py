"""`specdec probe` on a real server leaves specdec_requests_total alone: its orchestrator
request (max_tokens 0, refused by name) is marked as a probe and not counted, while the same
request from a user is counted as finish_reason "invalid"."""
import subprocess
import sys

from specdec import names
from specdec.serving import probe
from tests.e2e.conftest import ROOT, post, wait_for


def invalid_count(server) -> float:
    try:
        return server.metric("specdec_requests_total", finish_reason="invalid")
    except KeyError:   # no request has been counted under this label yet
        return 0.0


def test_probes_are_not_counted_but_invalid_requests_are(server):
    before = invalid_count(server)
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "specdec.cli", "probe",
                               "--url", f"http://{server.http}", "--timeout", "30"],
                              cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"{names.ORCHESTRATOR}: ok" in done.stdout, done.stdout
    assert invalid_count(server) == before

    # The probe's body without its marker: a user's invalid request, which is counted.
    user = {k: v for k, v in probe.ORCHESTRATOR_BODY.items() if k != probe.PARAMETER}
    status, reply = post(server, f"/v2/models/{names.ORCHESTRATOR}/generate", user)
    assert status == 400 and names.MAX_TOKENS in reply.get("error", ""), (status, reply)
    assert wait_for(lambda: invalid_count(server) == before + 1, timeout=30), \
        (before, invalid_count(server))
