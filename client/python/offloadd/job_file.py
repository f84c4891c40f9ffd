"""Job specs from dicts and YAML job files, with job.proto's field names.

Read as offloadd.spec_reader describes (and as offloadctl reads job files): enum values in full
("DATASET_FORMAT_ALPACA") or short ("alpaca"), byte sizes as "24GiB", "500MB" or bytes, and every
problem reported at once in a JobSpecError (a ValueError) whose field_violations name each field
by its snake_case path, with "did you mean" for near misses. One rule of transformers v5 is applied
here: a training.warmup_steps below 1 written as a fraction is warmup_ratio; and one of DeepSpeed's:
per_device_train_batch_size: auto is auto_find_batch_size: true. Nothing is silently ignored.
"""

from __future__ import annotations

import math
import os
from typing import Any, Optional, Union

import grpc
import yaml

from offloadd.errors import FieldViolation, InvalidArgument
from offloadd.spec_reader import _short, read_message
from offloadd.v1 import job_pb2

# A job spec is small; YAML aliases can make a few hundred bytes expand into billions of values
# (a "billion laughs" alias bomb). Counting stops at these bounds, as offloadctl's does.
MAX_JOB_FILE_VALUES = 100_000
MAX_JOB_FILE_DEPTH = 64


class JobSpecError(InvalidArgument, ValueError):
    """A job spec with problems, found before anything is sent: an InvalidArgument (as the daemon's
    refusals are) and a ValueError. field_violations lists every one (FieldViolation(field,
    description), field paths in snake_case); spec is the JobSpec of the fields that did read."""

    def __init__(self, source: str, field_violations: list, spec: Optional[job_pb2.JobSpec] = None):
        n = len(field_violations)
        where = "" if source == "job spec" else " in the job spec"
        super().__init__(grpc.StatusCode.INVALID_ARGUMENT, f"{source}: {n} problem{'' if n == 1 else 's'}{where}",
                         field_violations)
        self.source = source
        self.spec = spec


def merge_violations(client: list, daemon: list) -> list:
    """The client's violations followed by the daemon's for the part of the spec that read; a
    daemon violation on a field the client reported, or above or below one, is dropped (the daemon
    saw that field unset). As offloadctl's MergeViolations."""
    def same_or_below(path: str, root: str) -> bool:
        return path == root or path.startswith(root + ".") or path.startswith(root + "[")

    out = list(client)
    for d in daemon:
        if not any(same_or_below(d.field, c.field) or same_or_below(c.field, d.field) for c in client):
            out.append(d)
    return out


def _check_bounds(value: Any, budget: list, depth: int = 0) -> None:
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_JOB_FILE_DEPTH:
        raise ValueError(f"the job spec expands to more than {MAX_JOB_FILE_VALUES} values or "
                         f"{MAX_JOB_FILE_DEPTH} levels of nesting (YAML aliases?); a job spec is far smaller")
    if isinstance(value, dict):
        for v in value.values():
            _check_bounds(v, budget, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_bounds(v, budget, depth + 1)


def _move_warmup_fraction(spec: dict, out: list) -> dict:
    """transformers v5 reads a warmup_steps below 1 as the fraction of the total steps: it moves to
    warmup_ratio. A fraction of 1 or more is no whole number of steps and is refused."""
    training = spec.get("training")
    if not isinstance(training, dict):
        return spec
    v = training.get("warmup_steps")
    if not isinstance(v, float) or not math.isfinite(v) or v == math.floor(v):
        return spec
    training = dict(training)
    del training["warmup_steps"]
    if not 0 < v < 1:
        out.append(FieldViolation("training.warmup_steps", "must be a whole number of steps, or a fraction in "
                                  f"(0, 1) of the total steps (as transformers v5 reads it), got {v}"))
    elif training.get("warmup_ratio") is not None:
        out.append(FieldViolation("training.warmup_steps", f"a fraction ({v}, the warmup ratio as transformers v5 "
                                  "reads it) and warmup_ratio are both set; set one"))
    else:
        training["warmup_ratio"] = v
    return {**spec, "training": training}


def _move_auto_batch_size(spec: dict, out: list) -> dict:
    """per_device_train_batch_size: auto (as DeepSpeed configs write it) is transformers'
    auto_find_batch_size: true, with the micro-batch left to its default cap (64)."""
    training = spec.get("training")
    if not isinstance(training, dict) or training.get("per_device_train_batch_size") != "auto":
        return spec
    training = dict(training)
    del training["per_device_train_batch_size"]
    flag = training.get("auto_find_batch_size")
    if flag is not None and flag is not True:
        out.append(FieldViolation("training.per_device_train_batch_size",
                                  f"auto contradicts auto_find_batch_size: {_short(flag)}; set one of them"))
        return {**spec, "training": training}
    training["auto_find_batch_size"] = True
    return {**spec, "training": training}


def read_job_spec(spec: dict, source: str = "job spec") -> tuple[job_pb2.JobSpec, list]:
    """(the JobSpec of the fields that read, the list of FieldViolation for the rest)."""
    if not isinstance(spec, dict):
        raise ValueError(f"{source}: a job file must be a mapping of JobSpec fields")
    try:
        _check_bounds(spec, [MAX_JOB_FILE_VALUES])
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from None
    violations: list = []
    spec = _move_warmup_fraction(spec, violations)
    spec = _move_auto_batch_size(spec, violations)
    msg = job_pb2.JobSpec()
    violations += read_message(spec, msg)
    return msg, violations


def job_spec(spec: Union[job_pb2.JobSpec, dict, str, os.PathLike]) -> job_pb2.JobSpec:
    """A JobSpec from a JobSpec, a dict, or the path of a YAML/JSON job file. Raises JobSpecError
    listing every problem."""
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    source = "job spec"
    if isinstance(spec, (str, os.PathLike)):
        source = os.fspath(spec)
        with open(spec) as f:
            spec = yaml.safe_load(f)
    msg, violations = read_job_spec(spec, source)
    if violations:
        raise JobSpecError(source, violations, msg)
    return msg
