"""Typed exceptions for offloadd API errors.

Every failing call raises a subclass of OffloaddError carrying the gRPC code, the server's
message and, for INVALID_ARGUMENT from CreateJob, the per-field problems (google.rpc.BadRequest).
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    field: str
    description: str


class OffloaddError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str, field_violations=()):
        self.code = code
        self.message = message
        self.field_violations = list(field_violations)
        text = f"{code.name}: {message}"
        for v in self.field_violations:
            text += f"\n  {v.field}: {v.description}"
        super().__init__(text)


class InvalidArgument(OffloaddError):
    pass


class NotFound(OffloaddError):
    pass


class AlreadyExists(OffloaddError):
    """CreateJob with a request_id already used for a job with a different spec."""


class PermissionDenied(OffloaddError):
    pass


class Unauthenticated(OffloaddError):
    pass


class Unavailable(OffloaddError):
    pass


class Unimplemented(OffloaddError):
    pass


class DeadlineExceeded(OffloaddError):
    pass


class WaitTimeout(DeadlineExceeded, TimeoutError):
    """Client.wait's timeout passed before the job reached a final state. Also a TimeoutError.

    job_id, cursor (the last event delivered; resume with watch_job(job_id, after_cursor=cursor))
    and last_state (the last JobState seen, 0 when none) say where the wait stopped."""

    def __init__(self, message: str, *, job_id: str, cursor: int, last_state: int):
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        self.job_id = job_id
        self.cursor = cursor
        self.last_state = last_state


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.UNIMPLEMENTED: Unimplemented,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def from_rpc_error(err: grpc.RpcError) -> OffloaddError:
    """Converts a grpc.RpcError into the matching OffloaddError subclass."""
    violations = []
    status = rpc_status.from_call(err) if hasattr(err, "trailing_metadata") else None
    if status is not None:
        for detail in status.details:
            bad = error_details_pb2.BadRequest()
            if detail.Unpack(bad):
                violations.extend(FieldViolation(v.field, v.description) for v in bad.field_violations)
    cls = _BY_CODE.get(err.code(), OffloaddError)
    return cls(err.code(), err.details() or "", violations)
