"""What the tracker bridges log, read from a job: its spec as flat parameters, and its events as
metric rows (one per training step, one per evaluation), each with the step and the time the daemon
stamped on the event. Private; ``offloadd.tracking`` has the public names."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, Iterator, Optional

from google.protobuf import json_format

from offloadd.v1 import job_pb2

# The trainer's line for an evaluation (trainer/trainer.cc), where the progress event has no
# eval_loss field of its own (a daemon and SDK from before it).
_EVAL_LINE = re.compile(r"eval at step (\d+): loss (\S+)")
_HAS_EVAL_FIELD = "eval_loss" in job_pb2.JobProgress.DESCRIPTOR.fields_by_name

# JobProgress fields logged for every training step, by the names offloadd's API gives them.
TRAIN_FIELDS = ("loss", "learning_rate", "grad_norm", "tokens_per_second", "epoch")


@dataclasses.dataclass(frozen=True)
class Row:
    """Values measured at one step: the training values of ``TRAIN_FIELDS``, or ``eval_loss``."""

    step: int
    time_ms: int  # the event's time, milliseconds since the epoch
    values: dict[str, float]
    kind: str  # "train" or "eval"


def _time_ms(event: job_pb2.JobEvent) -> int:
    return event.time.seconds * 1000 + event.time.nanos // 1_000_000


class RowReader:
    """Turns a job's events, in cursor order, into metric rows, each step's training values and
    each evaluation once. A job reports every step once and its steps and evaluations in
    increasing order (a step replayed after a resume is not reported again), but one step may
    appear in several progress events: where the API has JobProgress.eval_loss, an evaluation's
    own event repeats its step's training values, and a checkpoint's step is reported again with
    the latest evaluation. So a row is made from the first event that reports a step (or an
    evaluation) past the last one seen. Not thread-safe."""

    def __init__(self):
        self._train_step = 0  # the last step whose training values were read (0: none)
        self._eval_step = -1  # the last step whose evaluation was read (-1: none; 0: before training)

    def rows(self, event: job_pb2.JobEvent) -> list[Row]:
        """The rows the event adds. Values that are not finite (a diverged loss, a grad norm that
        overflowed) are kept: both trackers store inf and NaN."""
        out = []
        if event.HasField("progress"):
            p = event.progress
            if _HAS_EVAL_FIELD and p.HasField("eval_loss"):
                out += self._eval(p.eval_step, p.eval_loss, event)
            if p.step > self._train_step:
                self._train_step = p.step
                out.append(Row(p.step, _time_ms(event), {f: float(getattr(p, f)) for f in TRAIN_FIELDS}, "train"))
        elif event.HasField("log") and not _HAS_EVAL_FIELD:
            m = _EVAL_LINE.match(event.log.message)
            if m:
                out += self._eval(int(m.group(1)), float(m.group(2)), event)
        return out

    def _eval(self, step: int, loss: float, event: job_pb2.JobEvent) -> list[Row]:
        if step <= self._eval_step:
            return []
        self._eval_step = step
        return [Row(step, _time_ms(event), {"eval_loss": loss}, "eval")]


def spec_dict(spec: job_pb2.JobSpec) -> dict[str, Any]:
    """The job spec as nested plain data, with job.proto's field names (enums by name, 64-bit
    integers as numbers); what is unset is left out."""
    d = json_format.MessageToDict(spec, preserving_proto_field_name=True)
    return _int64_as_numbers(spec, d)


def _int64_as_numbers(message, d: dict) -> dict:
    # MessageToDict writes int64 as strings (JSON's rule); trackers should see numbers.
    for name, value in d.items():
        field = message.DESCRIPTOR.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            if field.is_repeated:
                d[name] = [_int64_as_numbers(m, v) for m, v in zip(getattr(message, name), value)]
            else:
                d[name] = _int64_as_numbers(getattr(message, name), value)
        elif field.type in (field.TYPE_INT64, field.TYPE_UINT64, field.TYPE_SINT64, field.TYPE_FIXED64,
                            field.TYPE_SFIXED64):
            d[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return d


def flat_params(spec: job_pb2.JobSpec) -> dict[str, str]:
    """The spec as flat parameters: dotted paths ("training.learning_rate") to their values as
    text (JSON for numbers, booleans and lists; strings as they are)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, str):
            out[prefix] = value
        else:
            out[prefix] = json.dumps(value)

    walk("", spec_dict(spec))
    return out


def state_label(state: int) -> str:
    """"succeeded" for JOB_STATE_SUCCEEDED."""
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def run_name(job: job_pb2.Job, given: Optional[str]) -> str:
    return given or job.spec.display_name or job.id
