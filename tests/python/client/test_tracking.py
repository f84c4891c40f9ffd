"""offloadd.tracking.follow: a real job (the README's demo model, stories260K, on the test daemon,
CPU) streamed into a local MLflow tracking server started here (file store) and into W&B in offline
mode (read back from its .wandb files with W&B's own reader, `wandb leet inspect`). The logged
metrics equal the job's progress events (every step's loss, learning rate, grad norm, tokens/s and
epoch, each evaluation's loss), the params/config equal the job's spec, the run ends with the
job's outcome (a cancelled job's MLflow run KILLED; a failed job, from a fake daemon whose watch
stream breaks once, FAILED in MLflow and exit code 1 in W&B, each step logged once), and following
the job a second time logs nothing twice. Unknown trackers, options of the other tracker, an
AsyncClient and a missing library are refused by name."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from google.protobuf import json_format

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "daemon"))
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from daemon_process import DaemonProcess  # noqa: E402
from demo_model import write_demo  # noqa: E402

import offloadd  # noqa: E402
import offloadd.tracking  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

# python-requirements.txt installs both: CI fails here when they are missing.
import mlflow  # noqa: E402,F401
import wandb  # noqa: E402,F401

STEPS = 6
EVAL_LINE = re.compile(r"eval at step (\d+): loss (\S+)")
HAS_EVAL_FIELD = "eval_loss" in job_pb2.JobProgress.DESCRIPTOR.fields_by_name


@pytest.fixture(scope="module")
def daemon(binary_dir, source_dir, tmp_path_factory):
    binary = binary_dir / "daemon" / "offloadd"
    if not binary.exists():
        pytest.skip(f"{binary} is not built")
    ws = tmp_path_factory.mktemp("tracking")
    write_demo(ws, None, source_dir, records=64)
    d = DaemonProcess(binary, ws).start()
    yield d
    d.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """`mlflow server` on a file store. MLflow 3 keeps the file store in maintenance mode and
    refuses it unless MLFLOW_ALLOW_FILE_STORE=true opts in."""
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = open(root / "server.log", "w")
    env = dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"file:{root / 'store'}",
         "--default-artifact-root", f"file:{root / 'artifacts'}", "--host", "127.0.0.1", "--port", str(port),
         "--workers", "1"], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
        assert time.monotonic() < deadline, (root / "server.log").read_text()[-3000:]
        time.sleep(0.5)
    yield url
    os.killpg(proc.pid, 15)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
    log.close()


def job_spec(ws: pathlib.Path, name: str, steps: int = STEPS) -> dict:
    return {"display_name": name, "model": {"path": str(ws / "stories260K")},
            "dataset": {"paths": [str(ws / "alpaca.json")], "format": "alpaca", "max_seq_length": 128,
                        "eval_split": 0.125},
            "training": {"learning_rate": 3e-3, "per_device_train_batch_size": 4, "max_steps": steps,
                         "logging_steps": 1, "eval_steps": 3, "save_steps": 1000, "seed": 7},
            "labels": {"team": "nlp"},
            "output_dir": str(ws / name)}


def is_eval_event(p: job_pb2.JobProgress) -> bool:
    """An evaluation's own progress event, where the API has JobProgress.eval_loss."""
    return HAS_EVAL_FIELD and p.HasField("eval_loss") and p.eval_step == p.step


def job_metrics(c: offloadd.Client, job_id: str):
    """The finished job's own record of its metrics: {step: progress} and {step: eval loss} (from
    the evaluations' progress events where the API has eval_loss, else from the trainer's log)."""
    events = list(c.watch_job(job_id))
    progress = {e.progress.step: e.progress for e in events
                if e.HasField("progress") and not is_eval_event(e.progress)}
    if HAS_EVAL_FIELD:
        evals = {e.progress.eval_step: e.progress.eval_loss for e in events
                 if e.HasField("progress") and is_eval_event(e.progress)}
    else:
        evals = {int(m[1]): float(m[2]) for m in (EVAL_LINE.match(e.log.message) for e in events if e.HasField("log"))
                 if m}
    return progress, evals, events[-1].cursor


def flat_text(d: dict, prefix: str = "") -> dict[str, str]:
    """Leaf paths of nested data to their values as text: strings as they are, the rest as JSON
    (MessageToDict's quoted int64 "6" reads as the number 6's text, "6", too)."""
    out = {}
    for k, v in d.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.update(flat_text(v, path))
        else:
            out[path] = v if isinstance(v, str) else json.dumps(v)
    return out


def as_value(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text


def check_spec_in_config(spec: job_pb2.JobSpec, flat: dict[str, str]) -> None:
    """The tracker's config, flattened, is the job's spec as the daemon resolved it: the same keys
    and values (W&B's reader prints 3.0 as 3: numbers are compared as numbers)."""
    expected = flat_text(json_format.MessageToDict(spec, preserving_proto_field_name=True))
    assert set(flat) == set(expected)
    assert {k: as_value(v) for k, v in flat.items()} == {k: as_value(v) for k, v in expected.items()}
    assert flat["model.path"] == spec.model.path
    assert flat["dataset.format"] == "DATASET_FORMAT_ALPACA"
    assert json.loads(flat["dataset.eval_split"]) == 0.125
    assert json.loads(flat["training.learning_rate"]) == 3e-3
    assert json.loads(flat["training.max_steps"]) == spec.training.max_steps == STEPS
    assert json.loads(flat["dataset.paths"]) == list(spec.dataset.paths)
    assert flat["labels.team"] == "nlp"


def test_mlflow_run_holds_the_jobs_metrics_and_spec_once(daemon, mlflow_server):
    from mlflow.tracking import MlflowClient

    with offloadd.Client(daemon.target) as c:
        job = c.create_job(job_spec(daemon.workdir, "mlflow-job"))
        # Followed while it runs: the metrics arrive as the job makes them.
        first = offloadd.tracking.follow(job.id, to="mlflow", client=c, tracking_uri=mlflow_server,
                                         experiment="offloadd-tests", timeout=300)
        assert first.job.state == job_pb2.JOB_STATE_SUCCEEDED, first.job.error
        progress, evals, last_cursor = job_metrics(c, job.id)
        again = offloadd.tracking.follow(job.id, to="mlflow", client=c, tracking_uri=mlflow_server,
                                         experiment="offloadd-tests", timeout=60)
    assert sorted(progress) == list(range(1, STEPS + 1))
    assert sorted(evals) == [0, 3, 6]
    assert first.tracker == "mlflow" and first.resumed_after == 0 and first.rows == STEPS + len(evals)
    assert again.run_id == first.run_id and again.resumed_after == last_cursor and again.rows == 0

    ml = MlflowClient(tracking_uri=mlflow_server)
    run = ml.get_run(first.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "mlflow-job"
    assert run.data.tags["offloadd.job_id"] == job.id and run.data.tags["offloadd.state"] == "succeeded"
    assert run.data.tags["offloadd.cursor"] == str(last_cursor)

    def history(key):
        return sorted((m.step, m.value) for m in ml.get_metric_history(first.run_id, key))

    # Each value once (no duplicates after the second follow), exactly the job's double.
    for key in ("loss", "learning_rate", "grad_norm", "tokens_per_second", "epoch"):
        assert history(key) == [(s, getattr(p, key)) for s, p in sorted(progress.items())], key
    assert history("eval_loss") == sorted(evals.items())
    params = dict(run.data.params)
    assert params.pop("offloadd.job_id") == job.id
    check_spec_in_config(first.job.spec, params)
    assert params == flat_text(json_format.MessageToDict(first.job.spec, preserving_proto_field_name=True))  # as text


def test_mlflow_run_of_a_cancelled_job_is_killed(daemon, mlflow_server):
    from mlflow.tracking import MlflowClient

    ml = MlflowClient(tracking_uri=mlflow_server)
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(job_spec(daemon.workdir, "mlflow-cancelled", steps=100000))
        results = []
        t = threading.Thread(target=lambda: results.append(offloadd.tracking.follow(
            job.id, to="mlflow", client=c, tracking_uri=mlflow_server, experiment="offloadd-tests",
            timeout=300, flush_seconds=0)))
        t.start()
        deadline = time.monotonic() + 120
        while True:  # the live run shows the job's steps while it trains
            runs = ml.search_runs([ml.get_experiment_by_name("offloadd-tests").experiment_id],
                                  filter_string=f"tags.`offloadd.job_id` = '{job.id}'")
            if runs and len(ml.get_metric_history(runs[0].info.run_id, "loss")) >= 2:
                break
            assert time.monotonic() < deadline and t.is_alive(), "no steps reached the run"
            time.sleep(0.2)
        assert runs[0].info.status == "RUNNING"
        c.cancel_job(job.id)
        t.join(120)
        assert not t.is_alive()
    (result,) = results
    assert result.job.state == job_pb2.JOB_STATE_CANCELLED
    assert ml.get_run(result.run_id).info.status == "KILLED"
    assert ml.get_run(result.run_id).data.tags["offloadd.state"] == "cancelled"


def offline_records(run_dir: pathlib.Path) -> list[dict]:
    """The records of an offline run, by W&B's own reader of .wandb files."""
    r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(run_dir)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def test_wandb_offline_run_holds_the_jobs_metrics_and_spec_once(daemon, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(job_spec(daemon.workdir, "wandb-job"))
        first = offloadd.tracking.follow(job.id, to="wandb", client=c, directory=str(tmp_path),
                                         experiment="offloadd-tests", timeout=300)
        assert first.job.state == job_pb2.JOB_STATE_SUCCEEDED, first.job.error
        progress, evals, last_cursor = job_metrics(c, job.id)
        again = offloadd.tracking.follow(job.id, to="wandb", client=c, directory=str(tmp_path),
                                         experiment="offloadd-tests", timeout=60)
    assert first.tracker == "wandb" and first.run_id == job.id and first.rows == STEPS + len(evals)
    assert again.run_id == job.id and again.resumed_after == last_cursor and again.rows == 0

    run_dirs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{job.id}"))
    assert len(run_dirs) == 2, run_dirs  # each follow writes an offline run; `wandb sync` joins them
    rows: list[dict] = []
    for d in run_dirs:
        records = offline_records(d)
        rows += [r["history"]["item"] for r in records if r["type"] == "history"]
        (exit_record,) = [r["exit"] for r in records if r["type"] == "exit"]
        assert exit_record.get("exit_code", 0) == 0
    train = {int(r["train/global_step"]): r for r in rows if "train/loss" in r}
    evaluated = {int(r["train/global_step"]): r["eval/loss"] for r in rows if "eval/loss" in r}
    assert len(train) + len(evaluated) == len(rows) == STEPS + len(evals)  # each once, all in the first
    assert sorted(train) == sorted(progress)
    for step, p in progress.items():
        for key in ("loss", "learning_rate", "grad_norm", "tokens_per_second", "epoch"):
            assert train[step][f"train/{key}"] == getattr(p, key), (step, key)
    assert evaluated == evals

    (run_record,) = [r["run"] for r in offline_records(run_dirs[0]) if r["type"] == "run"]
    config = {k: v for k, v in run_record["config"]["update"].items() if k != "_wandb"}
    assert config.pop("offloadd_job_id") == job.id
    check_spec_in_config(first.job.spec, flat_text(config))
    # The cursor the second follow resumed after is the first run's; both end with the outcome.
    summaries = [offloadd.tracking._wandb.read_offline_summary(d) for d in run_dirs]
    assert summaries[0]["summary"]["offloadd/cursor"] == last_cursor
    assert all(s["exit_code"] == 0 and s["summary"]["offloadd/state"] == "succeeded" for s in summaries)


def test_unknown_trackers_and_foreign_options_are_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown tracker to='tensorbored'.*mlflow or wandb"):
        offloadd.tracking.follow("job-1", to="tensorbored", target="unix:///nonexistent.sock")
    with pytest.raises(ValueError, match=r"tracking_uri= is an option of to='mlflow', not of to='wandb'"):
        offloadd.tracking.follow("job-1", to="wandb", tracking_uri="http://x", target="unix:///nonexistent.sock")
    with pytest.raises(ValueError, match=r"entity= is an option of to='wandb'"):
        offloadd.tracking.follow("job-1", to="mlflow", entity="me", target="unix:///nonexistent.sock")


def test_an_async_client_is_refused_with_the_way_to_use_it():
    async def follow_with_an_async_client():
        async with offloadd.AsyncClient("unix:///nonexistent.sock") as async_client:
            offloadd.tracking.follow("job-1", to="mlflow", client=async_client)

    with pytest.raises(TypeError, match=r"client= takes an offloadd.Client, not AsyncClient.*asyncio.to_thread"):
        asyncio.run(follow_with_an_async_client())


def test_a_missing_tracker_library_names_the_package_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow now raises ImportError
    with pytest.raises(ImportError, match=r"needs the 'mlflow' package.*pip install mlflow-skinny"):
        offloadd.tracking.follow("job-1", to="mlflow", target="unix:///nonexistent.sock")


def test_report_to_mlflow_in_a_job_points_to_the_bridge(daemon):
    s = job_spec(daemon.workdir, "report-to-mlflow")
    s["training"]["report_to"] = ["mlflow"]
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(s, validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert "offloadd.tracking.follow(job_id, to=\"mlflow\")" in fields["training.report_to[0]"], fields


def failed_job_service():
    """A fake daemon whose job runs steps 1..3 and fails, with its watch stream broken once
    after two events (a daemon restarting)."""
    from fake_job_service import FakeJobService, scripted_events

    events = scripted_events("job-failing")
    events[-1].state_change.state = job_pb2.JOB_STATE_FAILED
    job = job_pb2.Job(error=job_pb2.ErrorStatus(message="worker 3 exited with signal 9"))
    job.spec.display_name = "failing"
    return FakeJobService(events, final_state=job_pb2.JOB_STATE_FAILED, job=job, break_calls=1, break_after=2)


def test_a_failed_job_fails_its_runs_and_a_broken_stream_logs_each_step_once(tmp_path, mlflow_server, monkeypatch):
    from fake_job_service import FakeServer
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    results = {}
    for to, options in (("mlflow", {"tracking_uri": mlflow_server}), ("wandb", {"directory": str(tmp_path)})):
        server = FakeServer(failed_job_service(), tmp_path)
        try:
            with offloadd.Client(server.target) as c:
                results[to] = offloadd.tracking.follow("job-failing", to=to, client=c, experiment="offloadd-failed",
                                                       timeout=60, **options)
            assert server.service.cursors == [0, 2], "the watch resumed after the last event"
        finally:
            server.stop()
    assert all(r.job.state == job_pb2.JOB_STATE_FAILED and r.rows == 3 for r in results.values())

    ml = MlflowClient(tracking_uri=mlflow_server)
    run = ml.get_run(results["mlflow"].run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "failing"
    assert run.data.tags["offloadd.error"] == "worker 3 exited with signal 9"
    assert [(m.step, m.value) for m in ml.get_metric_history(run.info.run_id, "loss")] == [(1, 1.0), (2, 2 / 3),
                                                                                            (3, 0.5)]
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-job-failing")
    summary = offloadd.tracking._wandb.read_offline_summary(run_dir)
    assert summary["exit_code"] == 1 and summary["summary"]["offloadd/state"] == "failed"
    rows = [r["history"]["item"] for r in offline_records(run_dir) if r["type"] == "history"]
    assert [(r["train/global_step"], r["train/loss"]) for r in rows] == [(1, 1.0), (2, 2 / 3), (3, 0.5)]
