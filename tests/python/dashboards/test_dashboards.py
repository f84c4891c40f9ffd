"""Grafana dashboards are valid JSON, use $datasource/$instance, and every query passes promtool's
PromQL parser and names only metrics the daemon declares."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

DECLARED_PREFIXES = ("offloadd_", "process_")


def dashboards(source_dir):
    return sorted((source_dir / "dashboards").glob("*.json"))


def panel_exprs(dash):
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            yield panel["title"], t["expr"]


def test_dashboards_use_variables(source_dir):
    files = dashboards(source_dir)
    assert files, "no dashboards found"
    for f in files:
        dash = json.loads(f.read_text())
        names = {v["name"] for v in dash["templating"]["list"]}
        assert {"datasource", "instance"} <= names, f
        for title, expr in panel_exprs(dash):
            assert 'instance=~"$instance"' in expr, f"{f.name}: {title}: {expr}"
        for panel in dash["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${datasource}", f"{f.name}: {panel['title']}"


def test_queries_parse_and_name_known_metrics(source_dir, tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    rules = {"groups": [{"name": "dashboard", "rules": []}]}
    for f in dashboards(source_dir):
        for i, (title, expr) in enumerate(panel_exprs(json.loads(f.read_text()))):
            concrete = expr.replace("$__rate_interval", "1m").replace("$instance", ".*")
            for metric in re.findall(r"\b([a-z_]+)(?:\{|\[)", concrete):
                if metric not in ("rate", "sum", "by", "histogram_quantile"):
                    assert metric.startswith(DECLARED_PREFIXES), f"{f.name}: {title}: unknown metric {metric}"
            rules["groups"][0]["rules"].append({"record": f"dashboard:q{i}", "expr": concrete})
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps(rules))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
