"""``JobResult``: what a fine-tuning job produced, as one plain object.

Modelled on OpenAI's fine-tuning job object and Vertex AI's tuning job: ``status`` as a string,
``fine_tuned_model`` (the directory of the exported Hugging Face model), ``trained_tokens``,
``error`` and timestamps, so code written for those reads the same here::

    result = client.result(job_id, raise_on_failure=True)   # waits for the job to end
    print(result.status, result.fine_tuned_model, result.trained_tokens, result.final_loss)

Where each field comes from (``offloadd.v1.Job`` in proto/offloadd/v1/job.proto):

===================== =================================================================
``id``                ``Job.id``
``status``            ``Job.state`` as a ``JobState`` (``"succeeded"``, ...)
``output_dir``        ``Job.spec.output_dir``, as the daemon resolved it: checkpoints and
                      the final model are written there
``fine_tuned_model``  the directory the daemon exported the final model to, as its job log
                      reports it (``"...; model in <dir>"``); for a succeeded job whose log
                      was not seen, ``output_dir``. ``None`` while the job has not
                      succeeded, or when it exported nothing (a random-init model)
``trained_tokens``    ``Job.progress.tokens_seen``
``steps``             ``Job.progress.step`` (of ``max_steps``)
``final_loss``        the loss the job's log reports at the end, else the last progress
                      report's; ``None`` before the first step
``error``             ``Job.error.message`` (a failure's reason, or a cancel's)
``created_at`` ...    ``Job.create_time``, ``start_time``, ``end_time`` (UTC datetimes)
===================== =================================================================
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import re
from typing import Any, Optional

import grpc

from offloadd.errors import JobCancelled, JobFailed
from offloadd.states import JobState
from offloadd.v1 import job_pb2

# The executor's last log line of a job that trained: "finished 12 steps, final loss 2.345678;
# model in /srv/out" (executor/job_execution.cc), and the trainer's "final model written to
# /srv/out" (trainer/state/trainer_state.cc).
_MODEL_IN = re.compile(r"; model in (.+)$")
_MODEL_WRITTEN = re.compile(r"^final model written to (.+)$")
_FINAL_LOSS = re.compile(r"final loss ([-+0-9.eE]+|nan|inf)")


class JobLogFacts:
    """What a job's log events say about its outcome: the exported model's directory and the
    final loss. Fed every event of a watch (others are ignored)."""

    def __init__(self) -> None:
        self.model_dir: Optional[str] = None
        self.final_loss: Optional[float] = None
        self.finished_seen = False  # the "finished N steps" line was seen

    def observe(self, event: job_pb2.JobEvent) -> None:
        """Reads one event; only log events matter."""
        if not event.HasField("log"):
            return
        text = event.log.message.strip()
        if text.startswith("finished "):
            self.finished_seen = True
            m = _MODEL_IN.search(text)
            if m:
                self.model_dir = m.group(1).strip()
            m = _FINAL_LOSS.search(text)
            if m:
                self.final_loss = float(m.group(1))
        else:
            m = _MODEL_WRITTEN.match(text)
            if m:
                self.model_dir = m.group(1).strip()


def _time(ts) -> Optional[datetime.datetime]:
    if ts.seconds == 0 and ts.nanos == 0:
        return None
    return ts.ToDatetime(tzinfo=datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class JobResult:
    """A job's outcome (or its state so far), OpenAI/Vertex-style.

    Built by ``Client.result`` / ``AsyncClient.result`` (which wait for the job to end), or from
    any ``offloadd.v1.Job`` with ``JobResult.from_job``. Immutable; ``job`` keeps the full
    protobuf message for everything else.

    Attributes:
        id: the job's id.
        status: its state as a ``JobState`` (a str: ``"succeeded"``, ``"failed"``, ...).
        display_name: the job spec's label.
        output_dir: where the job writes checkpoints and the final model (as resolved by the daemon).
        fine_tuned_model: the directory holding the exported Hugging Face model (config.json,
            model.safetensors, tokenizer files), loadable with ``from_pretrained``; ``None``
            unless the job succeeded and exported one.
        trained_tokens: tokens trained on so far (``Job.progress.tokens_seen``).
        steps: optimizer steps done.
        max_steps: the job's total optimizer steps (0 when not known yet).
        epoch: the epoch reached (fractional).
        final_loss: the training loss at the end (or at the last step so far); ``None``
            before the first step.
        error: why the job failed, or the reason of its cancel; ``None`` otherwise.
        error_code: the ``grpc.StatusCode`` of ``error``; ``None`` without one.
        created_at: when the job was submitted (UTC ``datetime``).
        started_at: when it first started running; ``None`` before.
        finished_at: when it reached a final state; ``None`` before.
        latest_checkpoint_step: the step of its latest checkpoint (0: none).
        job: the ``offloadd.v1.Job`` message this was built from.
    """

    id: str
    status: JobState
    display_name: str = ""
    output_dir: str = ""
    fine_tuned_model: Optional[str] = None
    trained_tokens: int = 0
    steps: int = 0
    max_steps: int = 0
    epoch: float = 0.0
    final_loss: Optional[float] = None
    error: Optional[str] = None
    error_code: Optional[grpc.StatusCode] = None
    created_at: Optional[datetime.datetime] = None
    started_at: Optional[datetime.datetime] = None
    finished_at: Optional[datetime.datetime] = None
    latest_checkpoint_step: int = 0
    job: Optional[job_pb2.Job] = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def from_job(cls, job: job_pb2.Job, logs: Optional[JobLogFacts] = None) -> "JobResult":
        """Builds the result of a job as the daemon reported it.

        Args:
            job: an ``offloadd.v1.Job`` (``get_job``, ``wait``, ``list_jobs``).
            logs: what the job's log events said (the clients' ``result`` collects them while
                they watch); without them a succeeded job's model is taken to be in its
                ``output_dir``, where the daemon exports it.

        Returns:
            The ``JobResult``.
        """
        status = JobState.of(job)
        logs = logs or JobLogFacts()
        model = None
        if status == JobState.SUCCEEDED:
            if logs.model_dir:
                model = logs.model_dir
            elif not logs.finished_seen and job.spec.output_dir:
                model = job.spec.output_dir
        loss = logs.final_loss
        if loss is None and job.progress.step > 0:
            loss = job.progress.loss
        error = job.error.message if job.HasField("error") and job.error.message else None
        code = None
        if error is not None:
            code = _status_code(job.error.code, status)
        return cls(
            id=job.id,
            status=status,
            display_name=job.spec.display_name,
            output_dir=job.spec.output_dir,
            fine_tuned_model=model,
            trained_tokens=job.progress.tokens_seen,
            steps=job.progress.step,
            max_steps=job.progress.max_steps,
            epoch=job.progress.epoch,
            final_loss=loss,
            error=error,
            error_code=code,
            created_at=_time(job.create_time),
            started_at=_time(job.start_time),
            finished_at=_time(job.end_time),
            latest_checkpoint_step=job.latest_checkpoint_step,
            job=job,
        )

    @property
    def succeeded(self) -> bool:
        """True when the job ended ``succeeded``."""
        return self.status == JobState.SUCCEEDED

    @property
    def done(self) -> bool:
        """True when the job is in a final state (succeeded, failed or cancelled)."""
        return self.status.is_final

    def raise_for_status(self) -> "JobResult":
        """Raises when the job failed or was cancelled, like ``requests``' method of that name.

        Returns:
            This result, when the job did not fail and was not cancelled (it may still be running).

        Raises:
            JobFailed: the job ended ``failed``; ``.message`` is its error.
            JobCancelled: the job ended ``cancelled``; ``.message`` is the reason.
        """
        if self.status == JobState.FAILED:
            raise JobFailed(self.error_code or grpc.StatusCode.UNKNOWN,
                            f"job {self.id} failed: {self.error or 'no reason given'}",
                            job_id=self.id, status=self.status, result=self)
        if self.status == JobState.CANCELLED:
            raise JobCancelled(grpc.StatusCode.CANCELLED,
                               f"job {self.id} was cancelled" + (f": {self.error}" if self.error else ""),
                               job_id=self.id, status=self.status, result=self)
        return self

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data: states as strings, times as ISO 8601, no ``job``.

        Returns:
            A dict of the attributes above (``error_code`` by name, e.g. ``"RESOURCE_EXHAUSTED"``).
        """
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "job":
                continue
            v = getattr(self, f.name)
            if isinstance(v, JobState):
                v = v.value
            elif isinstance(v, datetime.datetime):
                v = v.isoformat()
            elif isinstance(v, grpc.StatusCode):
                v = v.name
            elif isinstance(v, float) and not math.isfinite(v):
                v = str(v)
            out[f.name] = v
        return out


def _status_code(code: int, status: JobState) -> Optional[grpc.StatusCode]:
    for c in grpc.StatusCode:
        if c.value[0] == code:
            return c if code != 0 else (grpc.StatusCode.CANCELLED if status == JobState.CANCELLED else None)
    return grpc.StatusCode.UNKNOWN

