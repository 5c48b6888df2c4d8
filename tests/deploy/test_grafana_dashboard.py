"""The Grafana dashboard: a dashboard Grafana imports, every panel querying metrics the server
declares, shipped by the chart as a ConfigMap for Grafana's sidecar. The same check against a
real server's /metrics is tests/e2e/test_grafana_dashboard.py."""
from __future__ import annotations

import json
import re

from .helpers import CHART, DASHBOARD, REPO, dashboard_metrics, missing_metrics


def declared() -> set[str]:
    """The metric families specdec/serving/metrics.py creates, with a histogram's series."""
    names = set(re.findall(r'"(specdec_[a-z0-9_]+)"', (REPO / "specdec" / "serving" /
                                                        "metrics.py").read_text()))
    return names | {f"{n}_{s}" for n in names for s in ("bucket", "sum", "count")}


def test_the_dashboard_is_one_grafana_imports():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["schemaVersion"] >= 36
    variables = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "model"} <= variables
    panels = [p for p in d["panels"] if p["type"] != "row"]
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in panels:
        assert p["title"] and p["targets"], p["title"]
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
        assert p["datasource"]["uid"] == "${datasource}"
        grid = p["gridPos"]
        assert grid["x"] + grid["w"] <= 24
    titles = " ".join(p["title"] for p in panels).lower()
    for topic in ("acceptance", "tokens per round", "time to first token", "inter-token",
                  "(k)", "drafting nothing", "batches", "errors"):
        assert topic in titles, topic


def test_every_panel_queries_a_metric_the_server_declares():
    wanted = dashboard_metrics(json.loads(DASHBOARD.read_text()))
    ours = {m for m in wanted if m.startswith("specdec_")}
    assert len(ours) >= 12
    assert missing_metrics(ours, declared()) == set()
    # And the check can fail: a panel naming a metric nobody exports is reported.
    assert missing_metrics(ours | {"specdec_no_such_total"}, declared()) == \
        {"specdec_no_such_total"}


def test_the_chart_ships_it_as_a_configmap_for_the_sidecar():
    template = (CHART / "templates" / "grafana-dashboard.yaml").read_text()
    assert template.lstrip().startswith("{{- if .Values.grafanaDashboard.enabled }}")
    assert 'Files.Get "dashboards/specdec.json"' in template
    assert "kind: ConfigMap" in template and ".Values.grafanaDashboard.labels" in template
    import yaml
    values = yaml.safe_load((CHART / "values.yaml").read_text())["grafanaDashboard"]
    assert values == {"enabled": False, "labels": {"grafana_dashboard": "1"}, "annotations": {}}
