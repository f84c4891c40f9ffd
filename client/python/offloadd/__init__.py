"""Python SDK for offloadd, the offloaded fine-tuning daemon.

Synchronous::

    from offloadd import Client
    with Client("unix:///run/offloadd/offloadd.sock") as c:
        print(c.health())                                     # "SERVING"
        job = c.submit("job.yaml")                             # an offloadd.v1.Job, queued
        result = c.result(job.id, raise_on_failure=True)       # waits; a JobResult
        print(result.status, result.fine_tuned_model, result.trained_tokens)

asyncio (same methods, awaited)::

    async with offloadd.AsyncClient() as c:
        job = await c.create_job("job.yaml")
        async for event in c.watch_job(job.id):
            print(offloadd.render_event(event))
        result = await c.result(job.id)

States are strings: ``JobState.of(job) == "running"``; ``list_jobs(states=["queued", "running"])``.
Errors are ``OffloaddError`` subclasses; a job that failed or was cancelled raises ``JobFailed`` /
``JobCancelled`` where ``raise_on_failure=True`` asks for it. docs/python_sdk.md has the guide;
``python -m pydoc offloadd`` (or ``-w`` for HTML) renders this reference.
"""

from offloadd.aio import AsyncClient
from offloadd.client import DEFAULT_TARGET, FINAL_STATES, Client
from offloadd.job_file import JobSpecError, job_spec
from offloadd.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FieldViolation,
    InvalidArgument,
    JobCancelled,
    JobError,
    JobFailed,
    NotFound,
    OffloaddError,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    WaitTimeout,
)
from offloadd.progress import ProgressPrinter, render_event
from offloadd.result import JobResult
from offloadd.states import JobState

__all__ = [
    "AlreadyExists",
    "AsyncClient",
    "Client",
    "DEFAULT_TARGET",
    "DeadlineExceeded",
    "FINAL_STATES",
    "FieldViolation",
    "InvalidArgument",
    "JobCancelled",
    "JobError",
    "JobFailed",
    "JobResult",
    "JobSpecError",
    "JobState",
    "NotFound",
    "OffloaddError",
    "PermissionDenied",
    "ProgressPrinter",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WaitTimeout",
    "job_spec",
    "render_event",
]
