"""A real Prometheus scrapes a real offloadd; every dashboard query must return data through
Prometheus's HTTP API, and the shipped scrape config must pass promtool."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "daemon"))
from daemon_process import DaemonProcess  # noqa: E402

import offloadd  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus not installed (Debian package 'prometheus')")


# Metrics fed by TrainMetrics (daemon/metrics/train_metrics.h): no series before a job runs.
JOB_METRICS = re.compile(r"\boffloadd_(train_\w+|link_bytes_total|gpu_memory_peak_bytes|jobs)\b")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def query(port: int, expr: str) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    return json.loads(urllib.request.urlopen(url, timeout=10).read())


def test_shipped_scrape_config_is_valid(source_dir):
    promtool = shutil.which("promtool")
    r = subprocess.run([promtool, "check", "config", str(source_dir / "deploy" / "prometheus" / "offloadd.yml")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_dashboard_query_returns_data(binary_dir, source_dir, tmp_path):
    (tmp_path / "daemon").mkdir()
    daemon = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path / "daemon").start()
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: offloadd\n    static_configs: [{{targets: ['127.0.0.1:{daemon.metrics_port}']}}]\n")
    prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
    try:
        # Generate gRPC traffic between scrapes until Prometheus holds a few samples of it.
        deadline = time.monotonic() + 60
        with offloadd.Client(daemon.target) as c:
            while True:
                c.health()
                c.node_info()
                try:
                    r = query(port, 'count_over_time(offloadd_grpc_requests_total{method="GetNodeInfo"}[1m])')
                    if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) >= 4:
                        break
                except OSError:
                    pass  # Prometheus still starting
                assert time.monotonic() < deadline, (tmp_path / "prometheus.log").read_text()[-2000:]
                time.sleep(0.5)
        # Training panels have series only once a job has reported a step. Until this test runs
        # a job (the pipeline, issue #6), they may be empty; as soon as any job has reported,
        # every query must return data again.
        job_ran = bool(query(port, "offloadd_train_steps_total")["data"]["result"])
        empty = []
        for f in sorted((source_dir / "dashboards").glob("*.json")):
            for panel in json.loads(f.read_text())["panels"]:
                for t in panel.get("targets", []):
                    expr = t["expr"].replace("$instance", ".*").replace("$__rate_interval", "30s")
                    r = query(port, expr)
                    assert r["status"] == "success", (panel["title"], expr, r)
                    if not r["data"]["result"] and (job_ran or not JOB_METRICS.search(expr)):
                        empty.append(f"{f.name}: {panel['title']}: {expr}")
        assert not empty, "queries without data:\n" + "\n".join(empty)
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        daemon.stop()
