"""What the sync ``Client`` and the ``AsyncClient`` share, so that neither copies the other:
target and credential handling, request building, the health answer, the job spec's check
before CreateJob, and the logic of ``wait`` (cursor bookkeeping, reconnect backoff, deadline)
without its I/O. Each client only does the calls and the sleeping (``time.sleep`` or
``asyncio.sleep``) around these. Private: the public names are in ``offloadd``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Any, Optional, Union

import grpc
from grpc_health.v1 import health_pb2

from offloadd.errors import OffloaddError, Unavailable, WaitTimeout, from_rpc_error
from offloadd.job_file import JobSpecError, job_spec, merge_violations
from offloadd.progress import ProgressPrinter, state_name
from offloadd.result import JobLogFacts
from offloadd.states import state_numbers
from offloadd.v1 import job_pb2, job_service_pb2

DEFAULT_TARGET = "unix:///run/offloadd/offloadd.sock"

# States a job never leaves (offloadd.v1.JobState numbers; JobState.is_final says the same).
FINAL_STATES = frozenset({job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED})

# Codes of a watch stream that broke rather than failed: the daemon restarting or draining
# (UNAVAILABLE, or CANCELLED once its shutdown grace ends), a dropped connection, an aborted call.
BROKEN_STREAM = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})
FIRST_RETRY_S = 0.1
MAX_RETRY_S = 5.0

SpecLike = Union[job_pb2.JobSpec, dict, str, os.PathLike]


# --- channels -------------------------------------------------------------------------------
class BearerToken(grpc.AuthMetadataPlugin):
    """Adds "authorization: Bearer <token>" to every call."""

    def __init__(self, token: str):
        self._header = f"Bearer {token}"

    def __call__(self, context, callback):
        callback((("authorization", self._header),), None)


@dataclasses.dataclass(frozen=True)
class ChannelSettings:
    """How to open a channel to the daemon: ``credentials`` None means an insecure Unix socket."""

    target: str
    credentials: Optional[grpc.ChannelCredentials]
    options: tuple


def channel_settings(target: Optional[str], tls_ca_file: Optional[str], token_file: Optional[str],
                     tls_server_name: Optional[str]) -> ChannelSettings:
    """The target (default: $OFFLOADD_TARGET, then DEFAULT_TARGET) and its credentials: none for
    "unix:" targets; TLS (tls_ca_file) plus the bearer token of token_file for TCP, which the
    daemon serves only that way."""
    target = target or os.environ.get("OFFLOADD_TARGET") or DEFAULT_TARGET
    if target.startswith("unix:"):
        return ChannelSettings(target, None, ())
    if not tls_ca_file or not token_file:
        raise ValueError(
            f"TCP target {target} needs tls_ca_file and token_file "
            "(offloadd serves TCP only with TLS and a bearer token)"
        )
    with open(tls_ca_file, "rb") as f:
        ca = f.read()
    with open(token_file) as f:
        token = f.read().strip()
    creds = grpc.composite_channel_credentials(
        grpc.ssl_channel_credentials(root_certificates=ca),
        grpc.metadata_call_credentials(BearerToken(token)),
    )
    options = (("grpc.ssl_target_name_override", tls_server_name),) if tls_server_name else ()
    return ChannelSettings(target, creds, options)


def open_channel(grpc_module: Any, settings: ChannelSettings):
    """A channel from ``grpc`` or ``grpc.aio`` (same function names, same arguments)."""
    if settings.credentials is None:
        return grpc_module.insecure_channel(settings.target, options=list(settings.options))
    return grpc_module.secure_channel(settings.target, settings.credentials, options=list(settings.options))


# --- requests and answers -------------------------------------------------------------------
def health_request(service: str) -> health_pb2.HealthCheckRequest:
    return health_pb2.HealthCheckRequest(service=service)


def health_name(resp: health_pb2.HealthCheckResponse) -> str:
    return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)


def list_jobs_request(states: Any, page_size: int, page_token: str) -> job_service_pb2.ListJobsRequest:
    return job_service_pb2.ListJobsRequest(page_size=page_size, page_token=page_token, states=state_numbers(states))


def list_metrics_request(job_id: str, after_step: Optional[int], limit: int) -> job_service_pb2.ListJobMetricsRequest:
    req = job_service_pb2.ListJobMetricsRequest(job_id=job_id, limit=limit)
    if after_step is not None:
        req.after_step = after_step
    return req


def list_events_request(job_id: str, after: int, limit: int, include_progress: bool,
                        include_logs: bool) -> job_service_pb2.ListJobEventsRequest:
    return job_service_pb2.ListJobEventsRequest(job_id=job_id, after=after, limit=limit,
                                                include_progress=include_progress, include_logs=include_logs)


def create_job_request(spec: job_pb2.JobSpec, validate_only: bool, request_id: str) -> job_service_pb2.CreateJobRequest:
    return job_service_pb2.CreateJobRequest(spec=spec, validate_only=validate_only, request_id=request_id)


def read_spec(spec: SpecLike) -> tuple[job_pb2.JobSpec, Optional[JobSpecError]]:
    """(the JobSpec, None), or (the part that read, the JobSpecError) when the spec has problems:
    the client then asks the daemon to validate that part (validate_only) and reports both
    sides' problems at once with ``spec_error_with_daemons``."""
    try:
        return job_spec(spec), None
    except JobSpecError as e:
        return e.spec, e


def spec_error_with_daemons(own: JobSpecError, daemon: OffloaddError) -> JobSpecError:
    """``own`` with the daemon's violations for the part of the spec that read (when the daemon
    answered with INVALID_ARGUMENT; otherwise ``own`` as it is)."""
    if daemon.code != grpc.StatusCode.INVALID_ARGUMENT:
        return own  # the daemon is not reachable: the spec's own problems are all there is to say
    return JobSpecError(own.source, merge_violations(own.field_violations, daemon.field_violations), own.spec)


# --- waiting --------------------------------------------------------------------------------
class WaitLoop:
    """The state of one ``wait``: the cursor, the last state seen, the deadline, the reconnect
    backoff and what the job's log said. The client's loop is::

        loop = WaitLoop(...)
        while True:
            call = WatchJob(loop.request(), timeout=loop.remaining())
            try:
                for event in call:
                    if loop.accept(event): on_event(event)
                job = loop.finished(GetJob())       # None: the stream ended early
                if job: return job
            except grpc.RpcError as err: loop.stream_failed(err)
            except OffloaddError as err: loop.get_job_failed(err)
            sleep(loop.pause())

    Each method raises what ``wait`` raises (WaitTimeout, an OffloaddError) when it is time to.
    """

    def __init__(self, job_id: str, timeout: Optional[float], reconnect_window: float, progress: bool,
                 include_progress: bool = True, after_cursor: int = 0):
        self.job_id = job_id
        self.timeout = timeout
        self.reconnect_window = reconnect_window
        self.include_progress = include_progress
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.cursor = after_cursor
        self.last_state = job_pb2.JOB_STATE_UNSPECIFIED
        self.printer = ProgressPrinter(sys.stderr) if progress else None
        self.logs = JobLogFacts()
        self.news = time.monotonic()  # last time the watch made progress
        self.retry = FIRST_RETRY_S
        self.broken: Optional[OffloaddError] = None

    def timed_out(self) -> WaitTimeout:
        seen = state_name(self.last_state).upper() if self.last_state else "no state"
        return WaitTimeout(
            f"job {self.job_id} did not finish within {self.timeout:g} s (last seen {seen}, cursor {self.cursor})",
            job_id=self.job_id, cursor=self.cursor, last_state=self.last_state)

    def remaining(self) -> Optional[float]:
        """Seconds left before the deadline (None: no deadline); raises WaitTimeout when none are."""
        if self.deadline is None:
            return None
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.timed_out()
        return left

    def request(self) -> job_service_pb2.WatchJobRequest:
        req = job_service_pb2.WatchJobRequest(job_id=self.job_id, after_cursor=self.cursor)
        if not self.include_progress:
            req.include_progress = False
        return req

    def accept(self, event: job_pb2.JobEvent) -> bool:
        """Books an event; False for one already delivered (never twice, whatever the server resends)."""
        if event.cursor <= self.cursor:
            return False
        self.cursor = event.cursor
        if event.HasField("state_change"):
            self.last_state = event.state_change.state
        self.logs.observe(event)
        self.news, self.retry = time.monotonic(), FIRST_RETRY_S
        if self.printer:
            self.printer.on_event(event)
        return True

    def finished(self, job: job_pb2.Job) -> Optional[job_pb2.Job]:
        """The job when it is final. The daemon ends a watch once the job is final and every event
        is out; the client confirms with GetJob, since a stream can also end early (a proxy, an
        older daemon): then None, and the watch is reopened."""
        if job.state in FINAL_STATES:
            return job
        self.broken = Unavailable(grpc.StatusCode.UNAVAILABLE,
                                  f"the watch stream ended while the job was {state_name(job.state).upper()}")
        return None

    def stream_failed(self, err: grpc.RpcError) -> None:
        """A watch that broke is retried; any other error, or the deadline, ends the wait."""
        if self.deadline is not None and (err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                                          or time.monotonic() >= self.deadline):
            raise self.timed_out() from None
        if err.code() not in BROKEN_STREAM:
            raise from_rpc_error(err) from None
        self.broken = from_rpc_error(err)

    def get_job_failed(self, err: OffloaddError) -> None:
        if err.code not in BROKEN_STREAM:
            raise err
        self.broken = err

    def pause(self) -> float:
        """Seconds to sleep before the watch is reopened; raises the last error once the watch
        made no progress for reconnect_window seconds."""
        now = time.monotonic()
        broken = self.broken
        assert broken is not None
        if now - self.news >= self.reconnect_window:
            raise type(broken)(
                broken.code,
                f"lost the watch of job {self.job_id} and could not resume it for {self.reconnect_window:g} s "
                f"(watch again with after_cursor={self.cursor}): {broken.message}") from None
        pause = min(self.retry, self.news + self.reconnect_window - now)
        if self.deadline is not None:
            pause = min(pause, self.deadline - now)
        self.retry = min(self.retry * 2, MAX_RETRY_S)
        return max(0.0, pause)

    def close(self) -> None:
        if self.printer:
            self.printer.close()
