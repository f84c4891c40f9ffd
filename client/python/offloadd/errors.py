"""Typed exceptions for offloadd API errors.

Every failing call raises a subclass of OffloaddError carrying the gRPC code, the server's
message and, for INVALID_ARGUMENT from CreateJob, the per-field problems (google.rpc.BadRequest).
The sync ``Client`` and the ``AsyncClient`` raise the same classes.

A job that ends without succeeding is not a failed call: ``Client.wait`` and ``Client.result``
return it, unless asked to raise (``raise_on_failure=True``); then they raise ``JobFailed`` or
``JobCancelled`` (both ``JobError``, an ``OffloaddError``), carrying the job's ``JobResult``.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


@dataclass(frozen=True)
class FieldViolation:
    """One problem in a request: ``field`` is its snake_case path in the JobSpec
    (``"training.learning_rate"``, ``"dataset.paths[1]"``), ``description`` what is wrong."""

    field: str
    description: str


class OffloaddError(Exception):
    """Base class of every error the SDK raises for an offloadd call.

    Attributes:
        code: the ``grpc.StatusCode`` of the failed call.
        message: the server's message.
        field_violations: list of ``FieldViolation``, one per problem, for INVALID_ARGUMENT
            (empty otherwise).
    """

    def __init__(self, code: grpc.StatusCode, message: str, field_violations=()):
        self.code = code
        self.message = message
        self.field_violations = list(field_violations)
        text = f"{code.name}: {message}"
        first = f": {self.field_violations[0].field}: " if self.field_violations else None
        if first and first in message:
            # The daemon's message inlines the first few problems after its head ("2 problems in
            # the job spec: model.path: ..."); listed below one per line, each is said once.
            text = f"{code.name}: {message[:message.index(first)]}:"
        for v in self.field_violations:
            text += f"\n  {v.field}: {v.description}"
        super().__init__(text)


class InvalidArgument(OffloaddError):
    """The request is invalid (INVALID_ARGUMENT); ``field_violations`` lists every problem."""


class NotFound(OffloaddError):
    """No such job or checkpoint (NOT_FOUND)."""


class AlreadyExists(OffloaddError):
    """CreateJob with a request_id already used for a job with a different spec."""


class PermissionDenied(OffloaddError):
    """A path outside the daemon's allowed roots, or a forbidden operation (PERMISSION_DENIED)."""


class Unauthenticated(OffloaddError):
    """TCP without a valid bearer token (UNAUTHENTICATED)."""


class Unavailable(OffloaddError):
    """The daemon is not reachable, restarting or draining (UNAVAILABLE); also a watch that
    could not be resumed within the client's reconnect_window."""


class Unimplemented(OffloaddError):
    """The daemon does not know this call (UNIMPLEMENTED): an older daemon."""


class DeadlineExceeded(OffloaddError):
    """The call's deadline passed (DEADLINE_EXCEEDED)."""


class WaitTimeout(DeadlineExceeded, TimeoutError):
    """Client.wait's timeout passed before the job reached a final state. Also a TimeoutError.

    job_id, cursor (the last event delivered; resume with watch_job(job_id, after_cursor=cursor))
    and last_state (the last JobState seen, 0 when none) say where the wait stopped."""

    def __init__(self, message: str, *, job_id: str, cursor: int, last_state: int):
        super().__init__(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        self.job_id = job_id
        self.cursor = cursor
        self.last_state = last_state

    @property
    def last_status(self):
        """``last_state`` as a ``JobState`` (``"running"``, ...; ``"unspecified"`` when none)."""
        from offloadd.states import JobState

        return JobState.parse(self.last_state)


class JobError(OffloaddError):
    """A job ended without succeeding, raised when asked to (``raise_on_failure=True``).

    Attributes:
        job_id: the job's id.
        status: its final ``JobState`` (``"failed"`` or ``"cancelled"``).
        result: its ``JobResult`` (``error``, ``steps``, ``trained_tokens``, ...).
        code: for ``JobFailed``, the ``grpc.StatusCode`` the daemon recorded in the job's error
            (``UNKNOWN`` when none); for ``JobCancelled``, ``CANCELLED``.
        message: the job's error message (for a cancel, its reason).
    """

    def __init__(self, code: grpc.StatusCode, message: str, *, job_id: str, status, result=None):
        super().__init__(code, message)
        self.job_id = job_id
        self.status = status
        self.result = result


class JobFailed(JobError):
    """The job ended FAILED: ``message`` is the daemon's reason (``Job.error.message``)."""


class JobCancelled(JobError):
    """The job ended CANCELLED: ``message`` is the cancel's reason."""


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
