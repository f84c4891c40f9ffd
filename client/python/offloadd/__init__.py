"""Python SDK for offloadd, the single-GPU offloaded fine-tuning daemon.

    from offloadd import Client
    with Client("unix:///run/offloadd/offloadd.sock") as c:
        print(c.health())           # "SERVING"
        print(c.node_info().gpus)
"""

from offloadd.client import DEFAULT_TARGET, Client
from offloadd.job_file import job_spec
from offloadd.errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    OffloaddError,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)

__all__ = [
    "Client",
    "DEFAULT_TARGET",
    "FieldViolation",
    "InvalidArgument",
    "NotFound",
    "OffloaddError",
    "PermissionDenied",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "job_spec",
]
