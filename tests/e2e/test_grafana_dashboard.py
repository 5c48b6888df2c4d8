"""Every metric the Grafana dashboard (deploy/helm/triton-specdec/dashboards/specdec.json)
queries is on a real server's /metrics: ours and Triton's own."""
import json
import urllib.request

from specdec_client import GenerationParams, generate_stream
from tests.deploy.helpers import DASHBOARD, dashboard_metrics, missing_metrics
from tests.e2e.conftest import heldout_prompts


def exported(server) -> set[str]:
    text = urllib.request.urlopen(f"http://{server.metrics}/metrics", timeout=10).read().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_every_metric_a_panel_queries_is_exported(server):
    list(generate_stream(server.http, heldout_prompts(1)[0],
                         GenerationParams(max_tokens=8, num_draft_tokens=2)))
    names = exported(server)
    wanted = dashboard_metrics(json.loads(DASHBOARD.read_text()))
    assert any(m.startswith("nv_") for m in wanted) and len(wanted) >= 13
    assert missing_metrics(wanted, names) == set()
    assert missing_metrics({"specdec_no_such_total"}, names) == {"specdec_no_such_total"}
