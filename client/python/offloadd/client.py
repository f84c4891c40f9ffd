"""The synchronous client: a small typed wrapper over offloadd's gRPC API (Unix socket, or TCP
with TLS and a bearer token). ``offloadd.AsyncClient`` (offloadd/aio.py) has the same methods
for asyncio; both build their requests and map errors in offloadd/_shared.py."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional

import grpc
from grpc_health.v1 import health_pb2_grpc

from offloadd import _shared
from offloadd._shared import DEFAULT_TARGET, FINAL_STATES, SpecLike  # noqa: F401 (public names)
from offloadd.errors import OffloaddError, from_rpc_error
from offloadd.result import JobResult
from offloadd.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc, node_service_pb2, node_service_pb2_grpc

_BearerToken = _shared.BearerToken  # the name before the shared module


class Client:
    """A connection to offloadd. Thread-safe; use as a context manager or call ``close()``.

    Calls return the API's protobuf messages (``offloadd.v1.Job``, ...); ``result`` returns a
    ``JobResult``, and ``JobState.of(job)`` reads any job's state as a string. Failed calls raise
    ``OffloaddError`` subclasses (``NotFound``, ``InvalidArgument`` with ``field_violations``, ...).

    Args:
        target: ``"unix:///path.sock"`` or ``"host:port"``; default ``$OFFLOADD_TARGET``, else
            ``DEFAULT_TARGET`` (``unix:///run/offloadd/offloadd.sock``).
        tls_ca_file: PEM file of the CA that signed the daemon's certificate. TCP targets need
            it and ``token_file``: the daemon serves TCP only with TLS and a bearer token.
        token_file: file holding the bearer token (surrounding whitespace ignored).
        tls_server_name: the name to check the daemon's certificate against, when it is not the
            target's host (e.g. ``"localhost"`` for a certificate made for it).
        timeout: deadline of each unary call, in seconds.
        reconnect_window: how long ``wait`` keeps trying to reopen a broken watch stream (the
            daemon restarting, the connection dropped) before it gives up; the clock restarts
            with every event.

    Raises:
        ValueError: a TCP target without ``tls_ca_file`` and ``token_file``.
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
        settings = _shared.channel_settings(target, tls_ca_file, token_file, tls_server_name)
        self.target = settings.target
        self.timeout = timeout
        self.reconnect_window = reconnect_window
        self._channel = _shared.open_channel(grpc, settings)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._node = node_service_pb2_grpc.NodeServiceStub(self._channel)
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
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
        """Asks the daemon's grpc.health.v1 service how it is.

        Args:
            service: the service to ask about; "" for the daemon as a whole.

        Returns:
            The status name: ``"SERVING"``, ``"NOT_SERVING"`` (draining), ...

        Raises:
            Unavailable: the daemon is not reachable.
        """
        return _shared.health_name(self._call(self._health.Check, _shared.health_request(service)))

    def node_info(self) -> node_service_pb2.NodeInfo:
        """The daemon's machine: GPUs (and which job holds each), CPU, memory, store directories,
        measured bandwidths, build.

        Returns:
            An ``offloadd.v1.NodeInfo``.
        """
        return self._call(self._node.GetNodeInfo, node_service_pb2.GetNodeInfoRequest())

    # --- jobs ------------------------------------------------------------------------------
    def create_job(self, spec: SpecLike, *, validate_only: bool = False, request_id: str = "") -> job_pb2.Job:
        """Submits a job (queues it), or only validates it.

        Args:
            spec: an ``offloadd.v1.JobSpec``, a dict with job.proto's field names (Hugging Face
                names and ``"24GiB"`` sizes accepted, see ``job_spec``), or the path of a YAML
                or JSON job file.
            validate_only: check the spec and return the job as it would be, without queueing it.
            request_id: an idempotency key: a retried call with the same key returns the job
                the first one created instead of queueing another.

        Returns:
            The created ``offloadd.v1.Job`` (state ``QUEUED``; its spec as the daemon resolved it).

        Raises:
            InvalidArgument: the spec has problems; ``field_violations`` lists every one. When
                the spec does not even read (a ``JobSpecError``), the daemon still checks the
                part that did, and its problems are listed too.
            AlreadyExists: ``request_id`` was used for a job with another spec.
        """
        spec, problem = _shared.read_spec(spec)
        if problem is not None:
            try:
                self.create_job(spec, validate_only=True)
            except OffloaddError as daemon:
                raise _shared.spec_error_with_daemons(problem, daemon) from None
            raise problem
        return self._call(self._jobs.CreateJob, _shared.create_job_request(spec, validate_only, request_id))

    def submit(
        self,
        spec: SpecLike,
        *,
        wait: bool = False,
        timeout: Optional[float] = None,
        on_event: Optional[Callable[[job_pb2.JobEvent], None]] = None,
        progress: bool = False,
        request_id: str = "",
    ) -> job_pb2.Job:
        """Queues a job (as ``create_job``) and optionally waits for it to end (as ``wait``).

        Args:
            spec: as for ``create_job``.
            wait: wait for the job to end and return it as it ended.
            timeout: with ``wait``: the longest wait, in seconds (None: no limit).
            on_event: with ``wait``: called with each of the job's events.
            progress: with ``wait``: draw a progress bar on stderr.
            request_id: as for ``create_job``.

        Returns:
            The queued ``offloadd.v1.Job``, or the finished one with ``wait=True``.
        """
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
        *,
        raise_on_failure: bool = False,
        after_cursor: int = 0,
    ) -> job_pb2.Job:
        """Waits until the job is succeeded, failed or cancelled, and returns it as it ended.

        When the watch stream breaks (the daemon restarts, the connection drops), the watch
        resumes after the last event delivered, retrying with backoff for up to
        ``reconnect_window`` seconds without news.

        Args:
            job_id: the job's id.
            timeout: bounds the whole wait, in seconds (None: no limit).
            on_event: called with each of the job's events once, in cursor order, from the first.
            progress: draw a progress bar on stderr (as ``offloadctl watch``).
            raise_on_failure: raise ``JobFailed`` / ``JobCancelled`` instead of returning a job
                that failed or was cancelled.
            after_cursor: deliver only the events after this cursor (0: from the first), as
                ``watch_job``; ``JobResult`` facts from the job's log then see only those.

        Returns:
            The finished ``offloadd.v1.Job`` (``JobState.of(job)`` gives its state as a string).

        Raises:
            WaitTimeout: ``timeout`` passed (a ``DeadlineExceeded`` and a ``TimeoutError``).
            JobFailed, JobCancelled: with ``raise_on_failure``.
            NotFound: no such job. Other errors are raised at once, too.
        """
        job, logs = self._wait(job_id, timeout, on_event, progress, after_cursor=after_cursor)
        if raise_on_failure:
            JobResult.from_job(job, logs).raise_for_status()
        return job

    def result(
        self,
        job_id: str,
        *,
        wait: bool = True,
        timeout: Optional[float] = None,
        raise_on_failure: bool = False,
        on_event: Optional[Callable[[job_pb2.JobEvent], None]] = None,
        progress: bool = False,
    ) -> JobResult:
        """The job's outcome as a ``JobResult``: ``status``, ``fine_tuned_model`` (the exported
        model's directory), ``trained_tokens``, ``final_loss``, ``error``, timestamps.

        Args:
            job_id: the job's id.
            wait: wait for the job to end first (as ``wait``). With False, a job that has not
                ended is described as it is now (``fine_tuned_model`` None).
            timeout: bounds the wait, in seconds (None: no limit).
            raise_on_failure: raise ``JobFailed`` / ``JobCancelled`` for a job that failed or
                was cancelled, instead of returning its result.
            on_event: called with each of the job's events, as for ``wait``.
            progress: draw a progress bar on stderr while waiting.

        Returns:
            The ``JobResult``.

        Raises:
            JobFailed, JobCancelled: with ``raise_on_failure``; ``.result`` holds the result.
            WaitTimeout: ``timeout`` passed.
            NotFound: no such job.
        """
        if not wait:
            job = self.get_job(job_id)
            if job.state not in FINAL_STATES:
                return JobResult.from_job(job)
        # Waiting reads the job's log, which names the exported model; progress events are only
        # fetched when someone looks at them.
        job, logs = self._wait(job_id, timeout, on_event, progress, include_progress=bool(on_event or progress))
        result = JobResult.from_job(job, logs)
        return result.raise_for_status() if raise_on_failure else result

    def _wait(self, job_id, timeout, on_event, progress, include_progress: bool = True, after_cursor: int = 0):
        loop = _shared.WaitLoop(job_id, timeout, self.reconnect_window, progress, include_progress, after_cursor)
        try:
            while True:
                call = self._jobs.WatchJob(loop.request(), timeout=loop.remaining())
                try:
                    for event in call:
                        if loop.accept(event) and on_event:
                            on_event(event)
                    job = loop.finished(self.get_job(job_id))
                    if job is not None:
                        return job, loop.logs
                except grpc.RpcError as err:
                    loop.stream_failed(err)
                except OffloaddError as err:  # from get_job
                    loop.get_job_failed(err)
                finally:
                    call.cancel()
                time.sleep(loop.pause())
        finally:
            loop.close()

    def get_job(self, job_id: str) -> job_pb2.Job:
        """The job as it is now.

        Args:
            job_id: the job's id.

        Returns:
            The ``offloadd.v1.Job``; ``JobState.of(job)`` reads its state as a string,
            ``JobResult.from_job(job)`` makes it a result object.

        Raises:
            NotFound: no such job.
        """
        return self._call(self._jobs.GetJob, job_service_pb2.GetJobRequest(job_id=job_id))

    def list_jobs(self, states: Any = (), page_size: int = 0) -> Iterator[job_pb2.Job]:
        """Yields every job, all pages, optionally only those in some states.

        Args:
            states: a state or an iterable of states: ``JobState`` members, names
                (``"running"``, ``"JOB_STATE_RUNNING"``) or ``offloadd.v1.JobState`` numbers.
                Empty: every job.
            page_size: jobs per request (0: the daemon's default).

        Yields:
            ``offloadd.v1.Job`` messages.

        Raises:
            ValueError: a state name that names no state.
        """
        token = ""
        while True:
            resp = self._call(self._jobs.ListJobs, _shared.list_jobs_request(states, page_size, token))
            yield from resp.jobs
            token = resp.next_page_token
            if not token:
                return

    def cancel_job(self, job_id: str, reason: str = "", force: bool = False) -> job_pb2.Job:
        """Cancels a job: a queued or paused one at once, a running one at its next step
        (``cancelling``, then ``cancelled``).

        Args:
            job_id: the job's id.
            reason: recorded as the job's error message.
            force: kill the job's processes at once (SIGKILL) instead of asking them to stop at
                the next step; also escalates a job already ``cancelling``. Without it, the daemon
                kills them after its ``jobs.cancel_grace_seconds``.

        Returns:
            The job after the request.
        """
        request = job_service_pb2.CancelJobRequest(job_id=job_id, reason=reason, force=force)
        return self._call(self._jobs.CancelJob, request)

    def pause_job(self, job_id: str) -> job_pb2.Job:
        """Pauses a running job: it writes a checkpoint and frees the GPU (``pausing``, then ``paused``).

        Args:
            job_id: the job's id.

        Returns:
            The job after the request.
        """
        return self._call(self._jobs.PauseJob, job_service_pb2.PauseJobRequest(job_id=job_id))

    def delete_job(self, job_id: str) -> job_pb2.Job:
        """Removes a job that ended (succeeded, failed or cancelled) from the daemon's records: its
        record and events. What it wrote to its output directory stays.

        Args:
            job_id: the job's id.

        Returns:
            The job as it was.

        Raises:
            OffloaddError: FAILED_PRECONDITION when the job has not ended (cancel it first).
        """
        return self._call(self._jobs.DeleteJob, job_service_pb2.DeleteJobRequest(job_id=job_id))

    def resume_job(self, job_id: str) -> job_pb2.Job:
        """Queues a paused job again; it continues from its pause checkpoint.

        Args:
            job_id: the job's id.

        Returns:
            The job after the request (``queued``).
        """
        return self._call(self._jobs.ResumeJob, job_service_pb2.ResumeJobRequest(job_id=job_id))

    def list_checkpoints(self, job_id: str):
        """The job's checkpoints, oldest first.

        Args:
            job_id: the job's id.

        Returns:
            A sequence of ``offloadd.v1.Checkpoint`` (``id``, ``step``, ``path``, ``size_bytes``, ``loss``).
        """
        return self._call(self._jobs.ListCheckpoints, job_service_pb2.ListCheckpointsRequest(job_id=job_id)).checkpoints

    def list_metrics(self, job_id: str, *, after_step: Optional[int] = None,
                     limit: int = 0) -> job_service_pb2.ListJobMetricsResponse:
        """One page of the job's metrics history: a row per step, in step order.

        Args:
            job_id: the job's id.
            after_step: rows of later steps only; ``None``: from the first row (step 0, the
                evaluation before training, when the job evaluates). Pass the last row's
                ``step`` of a page to get the next.
            limit: rows per page; 0: 1000, at most 10000.

        Returns:
            An ``offloadd.v1.ListJobMetricsResponse``: ``metrics`` (``offloadd.v1.StepMetrics``:
            ``step``, ``epoch``, ``loss``, ``learning_rate``, ``grad_norm``,
            ``tokens_per_second``, ``aux_loss``, ``eval_loss``; absent values are unset,
            ``HasField`` tells), ``has_more`` and ``capped``.

        Raises:
            NotFound: no such job.
        """
        return self._call(self._jobs.ListJobMetrics, _shared.list_metrics_request(job_id, after_step, limit))

    def iter_metrics(self, job_id: str, *, after_step: Optional[int] = None,
                     page_size: int = 0) -> Iterator[job_pb2.StepMetrics]:
        """Every row of the job's metrics history after ``after_step``, page by page
        (``list_metrics``), as the job has them now.

        Args:
            job_id: the job's id.
            after_step: rows of later steps only; ``None``: from the first row.
            page_size: rows per ``ListJobMetrics`` call; 0: 1000, at most 10000.

        Yields:
            ``offloadd.v1.StepMetrics`` rows, in step order.
        """
        while True:
            page = self.list_metrics(job_id, after_step=after_step, limit=page_size)
            yield from page.metrics
            if not page.has_more or not page.metrics:
                return
            after_step = page.metrics[-1].step

    def list_events(self, job_id: str, *, limit: int = 0, after: int = 0, include_progress: bool = True,
                    include_logs: bool = True) -> job_service_pb2.ListJobEventsResponse:
        """One page of the job's events, oldest first (what ``watch_job`` streams, without a
        stream).

        Args:
            job_id: the job's id.
            limit: events per page; 0: 100, at most 1000 (a page also stops at about 1 MiB).
            after: events after this cursor (0: from the first); pass the page's
                ``next_after`` to get the next page.
            include_progress: include the per-step progress events.
            include_logs: include log events.

        Returns:
            An ``offloadd.v1.ListJobEventsResponse``: ``events``, ``has_more``, ``next_after``.

        Raises:
            NotFound: no such job.
        """
        return self._call(self._jobs.ListJobEvents,
                          _shared.list_events_request(job_id, after, limit, include_progress, include_logs))

    def watch_job(self, job_id: str, after_cursor: int = 0) -> Iterator[job_pb2.JobEvent]:
        """Streams the job's events until it ends (no reconnect: ``wait`` has that).

        Args:
            job_id: the job's id.
            after_cursor: start after this event's cursor (0: from the first event); after a
                disconnect, pass the last cursor seen.

        Yields:
            ``offloadd.v1.JobEvent`` messages: state changes, progress, logs, checkpoints.
        """
        req = job_service_pb2.WatchJobRequest(job_id=job_id, after_cursor=after_cursor)
        try:
            yield from self._jobs.WatchJob(req)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
