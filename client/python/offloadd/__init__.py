"""Python SDK for offloadd, the single-GPU offloaded fine-tuning daemon.

    from offloadd import Client
    with Client("unix:///run/offloadd/offloadd.sock") as c:
        print(c.health())           # "SERVING"
        print(c.node_info().gpus)
        job = c.submit("job.yaml", wait=True, progress=True)   # returns the finished Job
"""

from offloadd.client import DEFAULT_TARGET, FINAL_STATES, Client
from offloadd.job_file import JobSpecError, job_spec
from offloadd.errors import (
    AlreadyExists,
    DeadlineExceeded,
    FieldViolation,
    InvalidArgument,
    NotFound,
    OffloaddError,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    Unimplemented,
    WaitTimeout,
)
from offloadd.progress import ProgressPrinter

__all__ = [
    "AlreadyExists",
    "Client",
    "DEFAULT_TARGET",
    "DeadlineExceeded",
    "FINAL_STATES",
    "FieldViolation",
    "InvalidArgument",
    "JobSpecError",
    "NotFound",
    "OffloaddError",
    "PermissionDenied",
    "ProgressPrinter",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "WaitTimeout",
    "job_spec",
]
