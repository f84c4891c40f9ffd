"""A real Prometheus scrapes a real offloadd while a tiny training job runs on the CPU; every
dashboard query must return data through Prometheus's HTTP API (0 is data: a CPU job reports 0
PCIe bytes and 0 GPU memory), and the shipped scrape config must pass promtool."""

from __future__ import annotations

import json
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "daemon"))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("prometheus") is None,
                                reason="prometheus not installed (Debian package 'prometheus')")

# A made-up peak (1 TFLOP/s) for the CPU so offloadd_train_mfu_ratio is exported: the daemon
# exports MFU only for a known peak (metrics.peak_flops).
PEAK_FLOPS = 1e12


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


def training_spec(ws: pathlib.Path) -> dict:
    """A tiny Llama on the CPU, with more steps than the test waits for: it is cancelled at the end.
    Its optimizer states are on the NVMe tier, so the store panels have series."""
    return {
        "display_name": "dashboards",
        "model": {"path": str(ws / "model"), "compute_dtype": "fp32"},
        "dataset": {"paths": [str(ws / "data.jsonl")], "format": "pretokenized", "max_seq_length": 64,
                    "eval_paths": [str(ws / "data.jsonl")]},  # the held-out loss panel's series
        "training": {"learning_rate": 1e-4, "per_device_train_batch_size": 4, "max_steps": 100000,
                     "logging_steps": 10, "save_steps": 100000, "eval_steps": 50},
        "offload": {"offload_optimizer": {"device": "nvme"}},
        "output_dir": str(ws / "out"),
    }


def wait_for(port: int, expr: str, at_least: float, deadline: float, log: pathlib.Path, tick=None) -> None:
    """Waits until the first series of `expr` reaches `at_least` in Prometheus; `tick` runs between
    polls."""
    while True:
        if tick:
            tick()
        try:
            r = query(port, expr)
            if r["data"]["result"] and float(r["data"]["result"][0]["value"][1]) >= at_least:
                return
        except OSError:
            pass  # Prometheus still starting
        assert time.monotonic() < deadline, f"{expr} never reached {at_least}\n" + log.read_text()[-2000:]
        time.sleep(0.5)


def test_every_dashboard_query_returns_data(binary_dir, source_dir, tmp_path):
    ws = tmp_path / "daemon"
    ws.mkdir()
    build_model(ws / "model", layers=2)
    write_pretokenized(ws / "data.jsonl", n=64)
    daemon = DaemonProcess(binary_dir / "daemon" / "offloadd", ws)
    daemon.config_path.write_text(daemon.config_path.read_text().replace(
        "  listen: 127.0.0.1:0\n", f"  listen: 127.0.0.1:0\n  peak_flops: {PEAK_FLOPS}\n"))
    daemon.start()
    port = free_port()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: offloadd\n    static_configs: [{{targets: ['127.0.0.1:{daemon.metrics_port}']}}]\n")
    prom_log = tmp_path / "prometheus.log"
    prom = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=open(prom_log, "wb"))
    try:
        with offloadd.Client(daemon.target) as c:
            job = c.create_job(training_spec(ws))
            deadline = time.monotonic() + 120

            def traffic():
                c.health()
                c.node_info()
                state = c.get_job(job.id).state
                assert state in (job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING), (
                    job_pb2.JobState.Name(state), c.get_job(job.id).error, daemon.log()[-3000:])

            # gRPC traffic between scrapes, and a job whose step series Prometheus has scraped
            # often enough for rate() over the dashboards' 30 s window.
            wait_for(port, 'count_over_time(offloadd_grpc_requests_total{method="GetNodeInfo"}[1m])', 4,
                     deadline, prom_log, traffic)
            wait_for(port, f'count_over_time(offloadd_train_steps_total{{job_id="{job.id}"}}[30s])', 4,
                     deadline, prom_log, traffic)
            empty = []
            for f in sorted((source_dir / "dashboards").glob("*.json")):
                for panel in json.loads(f.read_text())["panels"]:
                    for t in panel.get("targets", []):
                        expr = t["expr"].replace("$instance", ".*").replace("$job", ".*").replace("$__rate_interval", "30s")
                        r = query(port, expr)
                        assert r["status"] == "success", (panel["title"], expr, r)
                        if not r["data"]["result"]:
                            empty.append(f"{f.name}: {panel['title']}: {expr}")
            assert not empty, "queries without data:\n" + "\n".join(empty)
            running = query(port, 'offloadd_jobs{state="running"}')["data"]["result"]
            assert [float(r["value"][1]) for r in running] == [1.0], running
            c.cancel_job(job.id)
            assert c.wait(job.id, timeout=60).state == job_pb2.JOB_STATE_CANCELLED
    finally:
        prom.terminate()
        prom.wait(timeout=30)
        daemon.stop()
