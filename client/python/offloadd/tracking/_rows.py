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


def rows_of(event: job_pb2.JobEvent) -> Iterator[Row]:
    """The metric rows an event carries: a progress event its step's training values (or, where
    the API has the field, the evaluation it reports), a log event the evaluation it announces.
    Values that are not finite (a diverged loss, a grad norm that overflowed) are kept: both
    trackers store inf and NaN."""
    if event.HasField("progress"):
        p = event.progress
        if _HAS_EVAL_FIELD and p.HasField("eval_loss") and p.eval_step == p.step:
            # An evaluation's own progress event (it repeats the step's training values).
            yield Row(p.eval_step, _time_ms(event), {"eval_loss": p.eval_loss}, "eval")
            return
        if p.step <= 0:
            return
        values = {f: float(getattr(p, f)) for f in TRAIN_FIELDS}
        yield Row(p.step, _time_ms(event), values, "train")
    elif event.HasField("log") and not _HAS_EVAL_FIELD:
        m = _EVAL_LINE.match(event.log.message)
        if m:
            yield Row(int(m.group(1)), _time_ms(event), {"eval_loss": float(m.group(2))}, "eval")


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
