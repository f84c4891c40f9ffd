"""What offloadd.tracking logs, from hand-made events (no daemon, no tracker): one row per training
step with its values, one per evaluation (from the progress event's eval_loss where the API has
that field, else from the trainer's "eval at step N: loss X" log line, never both), each once
when a step is reported again, values that are not finite kept; the spec as flat parameters and
as a nested config with numbers for 64-bit integers, enums by name, lists as JSON and map entries
as keys."""

from __future__ import annotations

import json
import math

import pytest

from offloadd.tracking import _rows
from offloadd.v1 import job_pb2

HAS_EVAL_FIELD = "eval_loss" in job_pb2.JobProgress.DESCRIPTOR.fields_by_name


def progress(cursor: int, step: int, **values) -> job_pb2.JobEvent:
    e = job_pb2.JobEvent(cursor=cursor, job_id="job-1")
    e.time.seconds, e.time.nanos = 1_700_000_000 + cursor, 250_000_000
    e.progress.step = step
    for k, v in values.items():
        setattr(e.progress, k, v)
    return e


def log(cursor: int, message: str) -> job_pb2.JobEvent:
    return job_pb2.JobEvent(cursor=cursor, job_id="job-1", log=job_pb2.LogEvent(message=message))


def rows(*events) -> list:
    reader = _rows.RowReader()
    return [r for e in events for r in reader.rows(e)]


def test_a_training_step_is_one_row_with_its_values_and_time():
    (row,) = rows(progress(3, 2, loss=2.5, learning_rate=1e-4, grad_norm=0.75, tokens_per_second=900.0,
                           epoch=0.5, max_steps=10))
    assert (row.step, row.kind, row.time_ms) == (2, "train", 1_700_000_003_250)
    assert row.values == {"loss": 2.5, "learning_rate": 1e-4, "grad_norm": 0.75, "tokens_per_second": 900.0,
                          "epoch": 0.5}


def test_values_that_are_not_finite_are_kept():
    # A grad norm that overflowed, a diverged loss: MLflow and W&B both store inf and NaN (checked
    # by hand against mlflow server 3.17.2's file store and W&B 0.31's offline files), so the curve
    # shows the step as the job reported it.
    (row,) = rows(progress(1, 1, loss=2.0, learning_rate=1e-4, grad_norm=math.inf))
    assert row.values["grad_norm"] == math.inf and row.values["loss"] == 2.0


def test_other_events_step_zero_and_a_step_reported_again_carry_no_rows():
    state = job_pb2.JobEvent(cursor=3, state_change=job_pb2.StateTransition(state=job_pb2.JOB_STATE_RUNNING))
    assert rows(progress(1, 0), log(2, "plan: micro-batch 4"), state) == []
    # A checkpoint's step reported again: one row.
    assert [r.step for r in rows(progress(4, 1, loss=2.0), progress(5, 1, loss=2.0))] == [1]


@pytest.mark.skipif(HAS_EVAL_FIELD, reason="the API has JobProgress.eval_loss: evaluations come from it")
def test_an_evaluation_comes_from_the_trainers_log_line():
    (row,) = rows(log(5, "eval at step 4: loss 2.31457 over 1024 tokens (3 batches)"))
    assert (row.step, row.kind, row.values) == (4, "eval", {"eval_loss": 2.31457})
    (row,) = rows(log(6, "eval at step 8: loss nan over 1024 tokens"))
    assert row.step == 8 and math.isnan(row.values["eval_loss"])


@pytest.mark.skipif(not HAS_EVAL_FIELD, reason="the API has no JobProgress.eval_loss yet")
def test_an_evaluation_comes_from_its_progress_event_and_not_from_the_log():
    got = rows(
        progress(1, 0, eval_loss=3.0, eval_step=0),                  # before training
        progress(2, 1, loss=2.6, eval_loss=3.0, eval_step=0),        # step 1 carries the latest eval
        progress(3, 2, loss=2.5, eval_loss=3.0, eval_step=0),
        progress(4, 2, loss=2.5, eval_loss=2.25, eval_step=2),       # the evaluation's own event
        log(5, "eval at step 2: loss 2.25 over 1024 tokens"),        # its log line: not read
        progress(6, 2, loss=2.5, eval_loss=2.25, eval_step=2),       # a checkpoint at step 2
        # logging_steps 2: step 3 is not reported, but its evaluation's event carries its values.
        progress(7, 3, loss=2.4, eval_loss=2.0, eval_step=3),
    )
    assert [(r.kind, r.step) for r in got] == [("eval", 0), ("train", 1), ("train", 2), ("eval", 2), ("eval", 3),
                                               ("train", 3)]
    assert got[3].values == {"eval_loss": 2.25} and got[5].values["loss"] == 2.4


def spec() -> job_pb2.JobSpec:
    s = job_pb2.JobSpec(display_name="run", output_dir="/data/out")
    s.model.path = "/models/m"
    s.dataset.paths.extend(["/d/a.jsonl", "/d/b.jsonl"])
    s.dataset.format = job_pb2.DATASET_FORMAT_ALPACA
    s.training.learning_rate = 3e-4
    s.training.max_steps = 12_000_000_000  # an int64 past 2^32
    s.training.report_to.append("tensorboard")
    s.labels["team"] = "nlp"
    return s


def test_the_spec_as_flat_parameters():
    params = _rows.flat_params(spec())
    assert params["display_name"] == "run" and params["model.path"] == "/models/m"
    assert params["dataset.paths"] == json.dumps(["/d/a.jsonl", "/d/b.jsonl"])
    assert params["dataset.format"] == "DATASET_FORMAT_ALPACA"
    assert params["training.learning_rate"] == "0.0003"
    assert params["training.max_steps"] == "12000000000"  # a number, not JSON's quoted int64
    assert params["training.report_to"] == '["tensorboard"]'
    assert params["labels.team"] == "nlp"
    assert all(isinstance(v, str) for v in params.values())


def test_the_spec_as_a_nested_config():
    config = _rows.spec_dict(spec())
    assert config["training"]["max_steps"] == 12_000_000_000 and config["training"]["learning_rate"] == 3e-4
    assert config["labels"] == {"team": "nlp"} and config["dataset"]["paths"] == ["/d/a.jsonl", "/d/b.jsonl"]
