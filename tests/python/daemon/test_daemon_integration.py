"""The real offloadd binary, driven through both SDKs, the CLI, the metrics port and signals."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import urllib.request

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402

import offloadd  # noqa: E402


@pytest.fixture()
def daemon(binary_dir, tmp_path):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path).start()
    yield d
    d.stop()


def offloadctl(binary_dir, daemon, *args, check=True):
    return subprocess.run(
        [str(binary_dir / "client" / "offloadctl"), "--target", daemon.target, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=check,
    )


def test_python_sdk_health_and_node_info(daemon):
    with offloadd.Client(daemon.target) as c:
        assert c.health() == "SERVING"
        info = c.node_info()
    assert info.cpu.logical_cores >= 1
    assert info.memory.total_bytes > 0
    assert info.build.version == "0.1.0"
    assert info.build.torch_version.startswith("2.11.0")
    assert info.gpus or info.gpu_problem, "either GPUs or the reason there are none"
    assert [d.path for d in info.store_directories] == [str(daemon.workdir)]
    assert info.store_directories[0].available_bytes > 0


def test_cpp_client_health_and_node_info(binary_dir, daemon):
    assert offloadctl(binary_dir, daemon, "health").stdout.strip() == "SERVING"
    node = json.loads(offloadctl(binary_dir, daemon, "--json", "node").stdout)
    assert int(node["cpu"]["logical_cores"]) >= 1
    assert node["store_directories"][0]["path"] == str(daemon.workdir)
    human = offloadctl(binary_dir, daemon, "node").stdout
    assert "cpu" in human and "memory" in human and "io_uring" in human
    # The CPU AdamW kernel jobs will use, and why (the daemon inherits OFFLOADD_ADAMW_KERNEL).
    kernels = node["cpu"]["adamw_kernels"]
    assert kernels[-1] == "portable", kernels
    forced = os.environ.get("OFFLOADD_ADAMW_KERNEL", "auto")
    want = kernels[0] if forced == "auto" else forced
    assert node["cpu"]["adamw_kernel"] == want
    assert f"adamw       {want} kernel (" in human, human
    # The model families the engine trains, each with the architectures it accepts.
    families = {f["model_type"]: f["architectures"] for f in node["supported_families"]}
    for model_type, arch in [("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"),
                             ("qwen2", "Qwen2ForCausalLM"), ("qwen3", "Qwen3ForCausalLM"),
                             ("gemma2", "Gemma2ForCausalLM"), ("gemma3_text", "Gemma3ForCausalLM"),
                             ("gemma3", "Gemma3ForConditionalGeneration"), ("phi3", "Phi3ForCausalLM"),
                             ("olmo2", "Olmo2ForCausalLM"), ("gpt2", "GPT2LMHeadModel"),
                             ("gpt_oss", "GptOssForCausalLM")]:
        assert families.get(model_type) == [arch], (model_type, families)
    assert "families    llama (LlamaForCausalLM): " in human, human
    assert "            qwen3 (Qwen3ForCausalLM): " in human, human


def test_job_queries_on_an_empty_daemon(binary_dir, daemon):
    with offloadd.Client(daemon.target) as c:
        assert list(c.list_jobs()) == []
        with pytest.raises(offloadd.NotFound):
            c.get_job("job-1")
    with grpc.insecure_channel(daemon.target) as ch:
        stub = offloadd.v1.job_service_pb2_grpc.JobServiceStub(ch)
        with pytest.raises(grpc.RpcError) as e:
            stub.ListJobs(offloadd.v1.job_service_pb2.ListJobsRequest(page_token="bogus"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in e.value.details()
    r = offloadctl(binary_dir, daemon, "get", "job-1", check=False)
    assert r.returncode == 4 and "NOT_FOUND" in r.stderr  # 4: not found
    assert offloadctl(binary_dir, daemon, "list").stdout.startswith("JOB")
    assert (daemon.workdir / "state" / "jobs.db").exists()


def test_reflection_lists_services(daemon):
    with grpc.insecure_channel(daemon.target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        resp = next(stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")])))
    names = {s.name for s in resp.list_services_response.service}
    assert {"offloadd.v1.JobService", "offloadd.v1.NodeService", "grpc.health.v1.Health"} <= names


def test_socket_has_configured_mode(daemon):
    assert daemon.socket_path.stat().st_mode & 0o777 == 0o600


def test_metrics_pass_promtool(daemon):
    with offloadd.Client(daemon.target) as c:
        c.node_info()
    body = urllib.request.urlopen(f"http://127.0.0.1:{daemon.metrics_port}/metrics", timeout=10).read().decode()
    assert 'offloadd_build_info{' in body
    assert "process_resident_memory_bytes" in body
    assert 'offloadd_grpc_requests_total{code="OK",method="GetNodeInfo"} 1' in body
    assert "offloadd_serving 1" in body
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus'; scripts/setup.sh installs it)")
    r = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True)
    # promtool exits non-zero and prints the problem on format errors and lint findings.
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr


def test_sigterm_drains_and_exits_zero(daemon):
    assert daemon.terminate() == 0
    log = daemon.log()
    assert "draining" in log and "stopped cleanly" in log
    assert "STOPPING=1" in daemon.next_notification()
    assert not daemon.socket_path.exists(), "the socket is removed on a clean stop"


def test_second_daemon_refuses_live_socket(binary_dir, daemon, tmp_path_factory):
    other = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path_factory.mktemp("second"))
    # Its own state_dir (one on the same state_dir is refused earlier: test_daemon_startup_safety).
    other.config_path.write_text(daemon.config_path.read_text().replace(
        f"state_dir: {daemon.workdir / 'state'}", f"state_dir: {other.workdir / 'state'}"))
    proc = subprocess.run([str(other.binary), "--config", str(other.config_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "already serving" in proc.stderr
    with offloadd.Client(daemon.target) as c:
        assert c.health() == "SERVING", "the first daemon keeps serving"


def test_validate_config_names_unknown_key(binary_dir, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("server:\n  unix_sockett: /tmp/x.sock\n")
    r = subprocess.run([str(binary_dir / "daemon" / "offloadd"), "--validate-config", "--config", str(cfg)],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "server.unix_sockett: unknown key" in r.stderr


def test_validate_config_prints_effective_settings(binary_dir, source_dir):
    r = subprocess.run([str(binary_dir / "daemon" / "offloadd"), "--validate-config", "--config",
                        str(source_dir / "deploy" / "offloadd.yaml")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "configuration is valid" in r.stdout and "unix_socket: /run/offloadd/offloadd.sock" in r.stdout


def test_unreachable_daemon_is_a_clear_error(tmp_path):
    with offloadd.Client(f"unix://{tmp_path}/none.sock", timeout=3) as c:
        with pytest.raises(offloadd.Unavailable):
            c.health()


def test_node_shows_the_cached_node_profile(binary_dir, daemon):
    """`offloadctl node` shows the node profile jobs cache under <state_dir>/profiles (what the
    step planner prices plans with), says why when there is none, and names a corrupt file."""
    human = offloadctl(binary_dir, daemon, "node").stdout
    assert "profile     not measured yet: the first job that places its AdamW states" in human, human
    prof = daemon.workdir / "state" / "profiles"
    prof.mkdir(parents=True, exist_ok=True)
    (prof / "node-profile.json").write_text(json.dumps({
        "key": "h | cpu | 16 cores | AdamW 15 threads avx512bf16 | NVIDIA H200",
        "host_bytes_per_s": 122.6e9, "cpu_params_per_s": 4.38e9, "threads": 15, "kernel": "avx512bf16",
        "h2d_bytes_per_s": 55.3e9, "d2h_bytes_per_s": 55.2e9, "both_bytes_per_s": 101.3e9,
        "measure_seconds": 1.2, "measured_at": "2026-11-24T22:31:25Z",
        "adamw_by_threads": [{"threads": 1, "params_per_s": 0.61e9}, {"threads": 15, "params_per_s": 4.38e9}],
        "cpu_params_per_s_during_dma": 3.9e9, "store_dir": "/var/lib/offloadd/store",
        "store_read_bytes_per_s": 2.9e9, "store_write_bytes_per_s": 2.1e9, "store_direct_io": True}))
    human = offloadctl(binary_dir, daemon, "node").stdout
    assert ("profile     host memory 122.6 GB/s, AdamW 4.38 G params/s (15 threads, avx512bf16), "
            "PCIe H2D 55.3 / D2H 55.2 / both 101.3 GB/s, measured 2026-11-24 22:31:25 UTC") in human, human
    assert ("AdamW by threads: 1: 0.61 15: 4.38 G params/s; 3.90 while both PCIe directions copy") in human, human
    assert "store /var/lib/offloadd/store: write 2.10 / read 2.90 GB/s (O_DIRECT)" in human, human
    node = json.loads(offloadctl(binary_dir, daemon, "--json", "node").stdout)
    assert node["bandwidths"]["profile_key"].endswith("NVIDIA H200")
    (prof / "node-profile.json").write_text("{")
    human = offloadctl(binary_dir, daemon, "node").stdout
    assert "profile     " in human and "not a node profile" in human, human


def test_node_lists_the_cached_shape_profiles(binary_dir, daemon):
    """`offloadctl node` lists the per-block shape profiles jobs cache under
    <state_dir>/profiles/shapes, newest first, and names unreadable files."""
    shapes = daemon.workdir / "state" / "profiles" / "shapes"
    shapes.mkdir(parents=True, exist_ok=True)
    model = "llama/22 layers/1100048384 params/0123456789abcdef"
    block = {"mode": "recompute", "forward_s": 0.004, "backward_s": 0.011, "recompute_s": 0.004,
             "keep_bytes": 1 << 30, "recompute_bytes": 1 << 27, "forward_transient_bytes": 1 << 29,
             "backward_transient_bytes": 3 << 29}
    (shapes / "0000000000000001.json").write_text(json.dumps({
        "key": f"NVIDIA H200 | {model} | 32x1024 BFloat16", "gpu": "NVIDIA H200", "model": model,
        "batch": 32, "seq": 1024, "dtype": "BFloat16", "profiled_step": 2, "gpu_seconds": 0.6,
        "peak_reserved_bytes": 5 << 30, "peak_allocated_bytes": 9 << 29, "workspace_bytes": 3 << 29,
        "measured_at": "2026-11-26T15:00:00Z",
        "blocks": [dict(block, name="embedding"), dict(block, name="model.layers.0"), dict(block, name="head")]}))
    (shapes / "0000000000000002.json").write_text("[]")
    human = offloadctl(binary_dir, daemon, "node").stdout
    assert f"shape       NVIDIA H200 | {model} | 32x1024 BFloat16" in human, human
    assert ("3 blocks: forward 12.0 ms, backward 33.0 ms per micro-batch; activations 3 GiB if all kept; "
            "largest backward transient 1.5 GiB; peak 5 GiB, working set 1.5 GiB; "
            "measured 2026-11-26 15:00:00 UTC") in human, human
    assert "shape       unreadable: " in human and "0000000000000002.json" in human, human
    node = json.loads(offloadctl(binary_dir, daemon, "--json", "node").stdout)
    (p,) = node["shape_profiles"]
    assert p["batch"] == 32 and len(p["blocks"]) == 3 and p["blocks"][1]["name"] == "model.layers.0", p
