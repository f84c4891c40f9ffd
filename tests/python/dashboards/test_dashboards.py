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
            concrete = expr.replace("$__rate_interval", "1m").replace("$instance", ".*").replace("$job", ".*")
            for metric in re.findall(r"\b([a-z_]+)(?:\{|\[)", concrete):
                if metric not in ("rate", "sum", "by", "histogram_quantile"):
                    assert metric.startswith(DECLARED_PREFIXES), f"{f.name}: {title}: unknown metric {metric}"
            rules["groups"][0]["rules"].append({"record": f"dashboard:q{i}", "expr": concrete})
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps(rules))
    r = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


# Every metric a panel queries is declared in the sources, and per-job panels follow
# the Job variable, whose values come from offloadd_job_info (jobs stay selectable for
# metrics.job_series_retention_seconds after they end).
SOURCE_DIRS = ("daemon", "common", "storage", "workers", "trainer", "engine", "ipc")
# Per-job families: they carry job_id.
PER_JOB = re.compile(r"^(offloadd_train_|offloadd_link_bytes_total|offloadd_gpu_memory_peak_bytes|offloadd_job_info)")


def declared(source_dir):
    names = set()
    for d in SOURCE_DIRS:
        for f in (source_dir / d).rglob("*.cc"):
            names.update(re.findall(r'"((?:offloadd|process)_[a-z0-9_]+)"', f.read_text(errors="replace")))
    return names


def queries(dashboard):
    for panel in dashboard["panels"]:
        for t in panel.get("targets", []):
            if t.get("expr"):
                yield panel["title"], t["expr"]


def test_every_queried_metric_is_declared_and_per_job_ones_follow_the_job_variable(source_dir):
    dashboard = json.loads((source_dir / "dashboards" / "offloadd.json").read_text())
    names = declared(source_dir)
    assert "offloadd_job_info" in names, "offloadd_job_info is not declared"
    seen_per_job = 0
    for title, expr in queries(dashboard):
        for name, labels in re.findall(r"\b((?:offloadd|process)_[a-z0-9_]+)(\{[^}]*\})?", expr):
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            assert name in names or base in names, f"{title}: {name} is not a metric the sources declare"
            if PER_JOB.match(name):
                seen_per_job += 1
                assert 'job_id=~"$job"' in labels, f"{title}: {name} does not follow the Job variable"
    assert seen_per_job >= 15


def test_the_job_variable_lists_jobs_from_their_info_series(source_dir):
    dashboard = json.loads((source_dir / "dashboards" / "offloadd.json").read_text())
    job = next(v for v in dashboard["templating"]["list"] if v["name"] == "job")
    query = job["query"]["query"] if isinstance(job["query"], dict) else job["query"]
    assert query.startswith("label_values(offloadd_job_info") and query.endswith(", job_id)")
    assert job["multi"] and job["includeAll"]
    assert any(p.get("title") == "Jobs" and p["type"] == "table" for p in dashboard["panels"])
