"""A small typed wrapper over offloadd's gRPC API (Unix socket or TCP + TLS + bearer token)."""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Iterator, Optional, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from offloadd.errors import InvalidArgument, OffloaddError, Unavailable, WaitTimeout, from_rpc_error
from offloadd.job_file import JobSpecError, job_spec, merge_violations
from offloadd.progress import ProgressPrinter, state_name
from offloadd.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc, node_service_pb2, node_service_pb2_grpc

DEFAULT_TARGET = "unix:///run/offloadd/offloadd.sock"

# States a job never leaves.
FINAL_STATES = frozenset({job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED})

# Codes of a watch stream that broke rather than failed: the daemon restarting or draining
# (UNAVAILABLE, or CANCELLED once its shutdown grace ends), a dropped connection, an aborted call.
_BROKEN_STREAM = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED, grpc.StatusCode.CANCELLED})
_FIRST_RETRY_S = 0.1
_MAX_RETRY_S = 5.0


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str):
        self._header = f"Bearer {token}"

    def __call__(self, context, callback):
        callback((("authorization", self._header),), None)


class Client:
    """Connects to offloadd. Thread-safe; use as a context manager or call close().

    target: "unix:///path.sock" (default: $OFFLOADD_TARGET or DEFAULT_TARGET) or "host:port".
    TCP targets need tls_ca_file and token_file: the daemon serves TCP only with TLS and a token.
    timeout: per-call deadline of unary calls, in seconds.
    reconnect_window: how long wait() keeps trying to reopen a broken watch stream (daemon
    restarting, connection dropped) before it gives up; the clock restarts with every event.
    """

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        tls_ca_file: Optional[str] = None,
        token_file: Optional[str] = None,
        tls_server_name: Optional[str] = None,
        timeout: float = 30.0,
        reconnect_window: float = 60.0,
    ):
        self.target = target or os.environ.get("OFFLOADD_TARGET") or DEFAULT_TARGET
        self.timeout = timeout
        self.reconnect_window = reconnect_window
        if self.target.startswith("unix:"):
            self._channel = grpc.insecure_channel(self.target)
        else:
            if not tls_ca_file or not token_file:
                raise ValueError(
                    f"TCP target {self.target} needs tls_ca_file and token_file "
                    "(offloadd serves TCP only with TLS and a bearer token)"
                )
            with open(tls_ca_file, "rb") as f:
                ca = f.read()
            with open(token_file) as f:
                token = f.read().strip()
            creds = grpc.composite_channel_credentials(
                grpc.ssl_channel_credentials(root_certificates=ca),
                grpc.metadata_call_credentials(_BearerToken(token)),
            )
            options = [("grpc.ssl_target_name_override", tls_server_name)] if tls_server_name else []
            self._channel = grpc.secure_channel(self.target, creds, options=options)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._node = node_service_pb2_grpc.NodeServiceStub(self._channel)
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # --- node and health -------------------------------------------------------------------
    def health(self, service: str = "") -> str:
        """grpc.health.v1 status name: "SERVING", "NOT_SERVING", ..."""
        resp = self._call(self._health.Check, health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)

    def node_info(self) -> node_service_pb2.NodeInfo:
        return self._call(self._node.GetNodeInfo, node_service_pb2.GetNodeInfoRequest())

    # --- jobs ------------------------------------------------------------------------------
    def create_job(
        self, spec: Union[job_pb2.JobSpec, dict, str, os.PathLike], *, validate_only: bool = False, request_id: str = ""
    ) -> job_pb2.Job:
        """Submits a job. `spec` is a JobSpec, a dict with job.proto's field names, or a path to
        a YAML job file. Raises InvalidArgument with .field_violations listing every problem: when
        the spec itself does not read (a JobSpecError), the daemon still checks the part that did,
        and its problems are listed too."""
        try:
            spec = job_spec(spec)
        except JobSpecError as e:
            try:
                self.create_job(e.spec, validate_only=True)
            except InvalidArgument as daemon:
                raise JobSpecError(e.source, merge_violations(e.field_violations, daemon.field_violations),
                                   e.spec) from None
            except OffloaddError:
                pass  # the daemon is not reachable: the spec's own problems are all there is to say
            raise
        req = job_service_pb2.CreateJobRequest(spec=spec, validate_only=validate_only, request_id=request_id)
        return self._call(self._jobs.CreateJob, req)

    def submit(
        self,
        spec: Union[job_pb2.JobSpec, dict, str, os.PathLike],
        *,
        wait: bool = False,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[job_pb2.JobEvent], None]] = None,
        progress: bool = False,
        request_id: str = "",
    ) -> job_pb2.Job:
        """Queues a job (as create_job) and returns it; with wait=True, waits for it to end (as
        wait(), with timeout, on_event and progress) and returns the finished job."""
        job = self.create_job(spec, request_id=request_id)
        if not wait:
            return job
        return self.wait(job.id, timeout=timeout, on_event=on_event, progress=progress)

    def wait(
        self,
        job_id: str,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[job_pb2.JobEvent], None]] = None,
        progress: bool = False,
    ) -> job_pb2.Job:
        """Waits until the job is SUCCEEDED, FAILED or CANCELLED and returns it as it ended.

        on_event sees each of the job's events once, in cursor order, from the first. When the
        stream breaks (the daemon restarts, the connection drops) the watch resumes after the last
        cursor delivered, retrying with backoff for up to reconnect_window seconds without news.
        timeout (seconds, None = no limit) bounds the whole wait: WaitTimeout (a DeadlineExceeded
        and a TimeoutError) when it passes. progress=True draws a progress bar on stderr.
        Other errors (NotFound, ...) are raised at once.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        cursor = 0
        last_state = job_pb2.JOB_STATE_UNSPECIFIED
        printer = ProgressPrinter(sys.stderr) if progress else None

        def timed_out() -> WaitTimeout:
            seen = state_name(last_state).upper() if last_state else "no state"
            return WaitTimeout(
                f"job {job_id} did not finish within {timeout:g} s (last seen {seen}, cursor {cursor})",
                job_id=job_id, cursor=cursor, last_state=last_state)

        news = time.monotonic()  # last time the watch made progress
        retry = _FIRST_RETRY_S
        try:
            while True:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise timed_out()
                call = self._jobs.WatchJob(
                    job_service_pb2.WatchJobRequest(job_id=job_id, after_cursor=cursor), timeout=remaining)
                try:
                    for event in call:
                        if event.cursor <= cursor:
                            continue  # never twice, whatever the server resends
                        cursor = event.cursor
                        if event.HasField("state_change"):
                            last_state = event.state_change.state
                        news, retry = time.monotonic(), _FIRST_RETRY_S
                        if printer:
                            printer.on_event(event)
                        if on_event:
                            on_event(event)
                    # The daemon ends a watch once the job is final and every event is out;
                    # confirm, since a stream can also end early (a proxy, an older daemon).
                    job = self.get_job(job_id)
                    if job.state in FINAL_STATES:
                        return job
                    broken = Unavailable(grpc.StatusCode.UNAVAILABLE,
                                         f"the watch stream ended while the job was {state_name(job.state).upper()}")
                except grpc.RpcError as err:
                    if deadline is not None and (err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                                                 or time.monotonic() >= deadline):
                        raise timed_out() from None
                    if err.code() not in _BROKEN_STREAM:
                        raise from_rpc_error(err) from None
                    broken = from_rpc_error(err)
                except OffloaddError as err:  # from get_job
                    if err.code not in _BROKEN_STREAM:
                        raise
                    broken = err
                finally:
                    call.cancel()
                now = time.monotonic()
                if now - news >= self.reconnect_window:
                    raise type(broken)(
                        broken.code,
                        f"lost the watch of job {job_id} and could not resume it for {self.reconnect_window:g} s "
                        f"(watch again with after_cursor={cursor}): {broken.message}") from None
                pause = min(retry, news + self.reconnect_window - now)
                if deadline is not None:
                    pause = min(pause, deadline - now)
                time.sleep(max(0.0, pause))
                retry = min(retry * 2, _MAX_RETRY_S)
        finally:
            if printer:
                printer.close()

    def get_job(self, job_id: str) -> job_pb2.Job:
        return self._call(self._jobs.GetJob, job_service_pb2.GetJobRequest(job_id=job_id))

    def list_jobs(self, states=(), page_size: int = 0) -> Iterator[job_pb2.Job]:
        """Yields every job (all pages), optionally only those in `states` (JobState values)."""
        token = ""
        while True:
            req = job_service_pb2.ListJobsRequest(page_size=page_size, page_token=token, states=list(states))
            resp = self._call(self._jobs.ListJobs, req)
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def cancel_job(self, job_id: str, reason: str = "") -> job_pb2.Job:
        return self._call(self._jobs.CancelJob, job_service_pb2.CancelJobRequest(job_id=job_id, reason=reason))

    def pause_job(self, job_id: str) -> job_pb2.Job:
        return self._call(self._jobs.PauseJob, job_service_pb2.PauseJobRequest(job_id=job_id))

    def resume_job(self, job_id: str) -> job_pb2.Job:
        return self._call(self._jobs.ResumeJob, job_service_pb2.ResumeJobRequest(job_id=job_id))

    def list_checkpoints(self, job_id: str):
        return self._call(self._jobs.ListCheckpoints, job_service_pb2.ListCheckpointsRequest(job_id=job_id)).checkpoints

    def watch_job(self, job_id: str, after_cursor: int = 0) -> Iterator[job_pb2.JobEvent]:
        """Streams events until the job ends; resume after a disconnect with the last cursor."""
        req = job_service_pb2.WatchJobRequest(job_id=job_id, after_cursor=after_cursor)
        try:
            yield from self._jobs.WatchJob(req)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
