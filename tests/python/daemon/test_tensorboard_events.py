"""training.report_to: tensorboard through the real daemon (CPU, fp32): the event files a job writes
under output_dir/runs/ are read with TensorBoard's own EventAccumulator and equal the job's metrics
(every step's loss, learning rate, grad norm and tokens/s from its progress events, each stored as
a float32 simple_value, so equal to float32 of the job's double; eval loss from the job's "eval at
step N: loss X" log line, printed with 6 significant digits, hence rel 1e-5). A paused and resumed
job adds a second file whose steps continue the first's. Other report_to values are refused by name."""

from __future__ import annotations

import pathlib
import re
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_training_jobs import Events, assets, daemon, logs, progress, spec, workspace  # noqa: E402,F401

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2
event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def read_runs(runs: pathlib.Path) -> dict[str, dict[int, float]]:
    acc = event_accumulator.EventAccumulator(str(runs), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def f32(x: float) -> float:
    return float(np.float32(x))


def event_files(runs: pathlib.Path) -> list[pathlib.Path]:
    return sorted(runs.glob("events.out.tfevents.*"))


def test_event_files_equal_the_jobs_metrics(daemon, workspace):
    s = spec(workspace, "tb", steps=8, save_steps=100)
    s["training"].update(report_to=["tensorboard"], eval_steps=4)
    s["dataset"]["eval_split"] = 0.125
    seen = []
    with offloadd.Client(daemon.target) as c:
        done = c.submit(s, wait=True, timeout=120, on_event=seen.append)
    assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen))
    runs = workspace / "tb" / "runs"
    assert len(event_files(runs)) == 1
    scalars = read_runs(runs)
    # Training values from the steps' own progress events (an evaluation's has eval_step == step).
    prog = {p.step: p for p in progress(seen) if not (p.HasField("eval_step") and p.eval_step == p.step)}
    assert sorted(prog) == list(range(1, 9))
    assert scalars["train/loss"] == {k: f32(p.loss) for k, p in prog.items()}
    assert scalars["train/learning_rate"] == {k: f32(p.learning_rate) for k, p in prog.items()}
    assert scalars["train/grad_norm"] == {k: f32(p.grad_norm) for k, p in prog.items()}
    assert scalars["train/tokens_per_second"] == {k: f32(p.tokens_per_second) for k, p in prog.items()}
    assert "train/aux_loss" not in scalars  # a dense model reports none
    evals = {int(m[1]): float(m[2]) for m in (re.match(r"eval at step (\d+): loss (\S+) ", t) for t in logs(seen)) if m}
    assert sorted(evals) == [0, 4, 8], logs(seen)
    assert sorted(scalars["eval/loss"]) == [0, 4, 8]
    for step, loss in evals.items():
        assert scalars["eval/loss"][step] == pytest.approx(loss, rel=1e-5)
    # The evaluations' progress events carry the loss itself (JobProgress.eval_loss).
    structured = {p.step: p.eval_loss for p in progress(seen) if p.HasField("eval_step") and p.eval_step == p.step}
    assert scalars["eval/loss"] == {k: f32(v) for k, v in structured.items()}


def test_a_resumed_job_continues_its_curves_in_a_new_file(daemon, workspace):
    s = spec(workspace, "tb_resume", steps=2000, save_steps=100000, lr=1e-4)
    s["training"]["report_to"] = ["tensorboard"]
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(s)
        ev = Events(c, job.id)
        ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 3)
        c.pause_job(job.id)
        ev.wait_for(lambda e: e.HasField("state_change") and e.state_change.state == S.JOB_STATE_PAUSED)
        at = c.list_checkpoints(job.id)[0].step
        runs = workspace / "tb_resume" / "runs"
        assert len(event_files(runs)) == 1
        cursor = ev.events[-1].cursor
        c.resume_job(job.id)
        ev.wait_for(lambda e: e.cursor > cursor and e.HasField("progress") and e.progress.step > at + 2)
        c.cancel_job(job.id)
        assert c.wait(job.id, timeout=60).state == S.JOB_STATE_CANCELLED
        ev.join()
    files = event_files(runs)
    assert len(files) == 2, files
    losses = {p.step: p.loss for p in progress(ev.events)}
    scalars = read_runs(runs)["train/loss"]
    assert sorted(scalars) == list(range(1, max(scalars) + 1)), "the steps continue across the files"
    assert max(scalars) > at + 2
    assert scalars == {k: f32(v) for k, v in losses.items()}


def test_unknown_report_to_is_refused_by_name(daemon, workspace):
    s = spec(workspace, "tb_bad", steps=2, save_steps=100)
    s["training"]["report_to"] = ["tensorboard", "wandb"]
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(s, validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert "training.report_to[1]" in fields and "'wandb'" in fields["training.report_to[1]"], fields
