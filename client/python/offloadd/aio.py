"""The asyncio client: ``offloadd.AsyncClient``, over ``grpc.aio``.

Same methods, arguments, results and errors as the sync ``offloadd.Client``, awaited;
``list_jobs`` and ``watch_job`` are async iterators::

    import asyncio, offloadd

    async def main():
        async with offloadd.AsyncClient("unix:///run/offloadd/offloadd.sock") as c:
            job = await c.create_job("job.yaml")
            async for event in c.watch_job(job.id):
                print(offloadd.render_event(event))
            result = await c.result(job.id, raise_on_failure=True)
            print(result.fine_tuned_model, result.trained_tokens)

    asyncio.run(main())
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Union

import grpc
import grpc.aio
from grpc_health.v1 import health_pb2_grpc

from offloadd import _shared
from offloadd._shared import FINAL_STATES, SpecLike
from offloadd.errors import OffloaddError, from_rpc_error
from offloadd.result import JobResult
from offloadd.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc, node_service_pb2, node_service_pb2_grpc

EventCallback = Callable[[job_pb2.JobEvent], Union[None, Awaitable[None]]]


class AsyncClient:
    """An asyncio connection to offloadd (``grpc.aio``). Use ``async with`` or ``await close()``.

    Create it inside the event loop that uses it (a ``grpc.aio`` channel belongs to one loop).
    Its methods are those of ``Client``, as coroutines: see there for what each does. Callbacks
    (``on_event``) may be plain functions or coroutine functions.

    Args:
        target: ``"unix:///path.sock"`` or ``"host:port"``; default ``$OFFLOADD_TARGET``, else
            ``DEFAULT_TARGET``.
        tls_ca_file: PEM file of the CA of the daemon's certificate (TCP targets need it).
        token_file: file holding the bearer token (TCP targets need it).
        tls_server_name: the name to check the daemon's certificate against.
        timeout: deadline of each unary call, in seconds.
        reconnect_window: how long ``wait`` keeps trying to reopen a broken watch stream.

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
        self._channel = _shared.open_channel(grpc.aio, settings)
        self._health = health_pb2_grpc.HealthStub(self._channel)
        self._node = node_service_pb2_grpc.NodeServiceStub(self._channel)
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    async def close(self) -> None:
        """Closes the channel; calls in flight are cancelled."""
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _call(self, method, request, timeout: Optional[float] = None):
        try:
            return await method(request, timeout=self.timeout if timeout is None else timeout)
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    # --- node and health -------------------------------------------------------------------
    async def health(self, service: str = "") -> str:
        """Asks the daemon's grpc.health.v1 service how it is (as ``Client.health``).

        Args:
            service: the service to ask about; "" for the daemon as a whole.

        Returns:
            The status name: ``"SERVING"``, ``"NOT_SERVING"``, ...
        """
        return _shared.health_name(await self._call(self._health.Check, _shared.health_request(service)))

    async def node_info(self) -> node_service_pb2.NodeInfo:
        """The daemon's machine (as ``Client.node_info``).

        Returns:
            An ``offloadd.v1.NodeInfo``.
        """
        return await self._call(self._node.GetNodeInfo, node_service_pb2.GetNodeInfoRequest())

    # --- jobs ------------------------------------------------------------------------------
    async def create_job(self, spec: SpecLike, *, validate_only: bool = False, request_id: str = "") -> job_pb2.Job:
        """Submits a job, or only validates it (as ``Client.create_job``).

        Args:
            spec: an ``offloadd.v1.JobSpec``, a dict with job.proto's field names, or a job file's path.
            validate_only: check the spec and return the job as it would be, without queueing it.
            request_id: an idempotency key.

        Returns:
            The created ``offloadd.v1.Job``.

        Raises:
            InvalidArgument: the spec has problems; ``field_violations`` lists every one.
        """
        spec, problem = _shared.read_spec(spec)
        if problem is not None:
            try:
                await self.create_job(spec, validate_only=True)
            except OffloaddError as daemon:
                raise _shared.spec_error_with_daemons(problem, daemon) from None
            raise problem
        return await self._call(self._jobs.CreateJob, _shared.create_job_request(spec, validate_only, request_id))

    async def submit(
        self,
        spec: SpecLike,
        *,
        wait: bool = False,
        timeout: Optional[float] = None,
        on_event: Optional[EventCallback] = None,
        progress: bool = False,
        request_id: str = "",
    ) -> job_pb2.Job:
        """Queues a job and optionally waits for it to end (as ``Client.submit``).

        Args:
            spec: as for ``create_job``.
            wait: wait for the job to end and return it as it ended.
            timeout: with ``wait``: the longest wait, in seconds (None: no limit).
            on_event: with ``wait``: called (or awaited) with each of the job's events.
            progress: with ``wait``: draw a progress bar on stderr.
            request_id: as for ``create_job``.

        Returns:
            The queued ``offloadd.v1.Job``, or the finished one with ``wait=True``.
        """
        job = await self.create_job(spec, request_id=request_id)
        if not wait:
            return job
        return await self.wait(job.id, timeout=timeout, on_event=on_event, progress=progress)

    async def wait(
        self,
        job_id: str,
        timeout: Optional[float] = None,
        on_event: Optional[EventCallback] = None,
        progress: bool = False,
        *,
        raise_on_failure: bool = False,
        after_cursor: int = 0,
    ) -> job_pb2.Job:
        """Waits until the job is succeeded, failed or cancelled (as ``Client.wait``: a broken
        watch is resumed after the last event delivered).

        Args:
            job_id: the job's id.
            timeout: bounds the whole wait, in seconds (None: no limit).
            on_event: called (or awaited) with each of the job's events once, in order.
            progress: draw a progress bar on stderr.
            raise_on_failure: raise ``JobFailed`` / ``JobCancelled`` instead of returning a job
                that failed or was cancelled.
            after_cursor: deliver only the events after this cursor (0: from the first).

        Returns:
            The finished ``offloadd.v1.Job``.

        Raises:
            WaitTimeout: ``timeout`` passed.
            JobFailed, JobCancelled: with ``raise_on_failure``.
        """
        job, logs = await self._wait(job_id, timeout, on_event, progress, after_cursor=after_cursor)
        if raise_on_failure:
            JobResult.from_job(job, logs).raise_for_status()
        return job

    async def result(
        self,
        job_id: str,
        *,
        wait: bool = True,
        timeout: Optional[float] = None,
        raise_on_failure: bool = False,
        on_event: Optional[EventCallback] = None,
        progress: bool = False,
    ) -> JobResult:
        """The job's outcome as a ``JobResult`` (as ``Client.result``).

        Args:
            job_id: the job's id.
            wait: wait for the job to end first; with False, a job that has not ended is
                described as it is now.
            timeout: bounds the wait, in seconds (None: no limit).
            raise_on_failure: raise ``JobFailed`` / ``JobCancelled`` for a job that failed or
                was cancelled.
            on_event: called (or awaited) with each of the job's events.
            progress: draw a progress bar on stderr while waiting.

        Returns:
            The ``JobResult``.

        Raises:
            JobFailed, JobCancelled: with ``raise_on_failure``.
            WaitTimeout: ``timeout`` passed.
        """
        if not wait:
            job = await self.get_job(job_id)
            if job.state not in FINAL_STATES:
                return JobResult.from_job(job)
        job, logs = await self._wait(job_id, timeout, on_event, progress, include_progress=bool(on_event or progress))
        result = JobResult.from_job(job, logs)
        return result.raise_for_status() if raise_on_failure else result

    async def _wait(self, job_id, timeout, on_event, progress, include_progress: bool = True, after_cursor: int = 0):
        loop = _shared.WaitLoop(job_id, timeout, self.reconnect_window, progress, include_progress, after_cursor)
        try:
            while True:
                call = self._jobs.WatchJob(loop.request(), timeout=loop.remaining())
                try:
                    async for event in call:
                        if loop.accept(event) and on_event:
                            done = on_event(event)
                            if inspect.isawaitable(done):
                                await done
                    job = loop.finished(await self.get_job(job_id))
                    if job is not None:
                        return job, loop.logs
                except grpc.RpcError as err:
                    loop.stream_failed(err)
                except OffloaddError as err:  # from get_job
                    loop.get_job_failed(err)
                finally:
                    call.cancel()
                await asyncio.sleep(loop.pause())
        finally:
            loop.close()

    async def get_job(self, job_id: str) -> job_pb2.Job:
        """The job as it is now (as ``Client.get_job``).

        Args:
            job_id: the job's id.

        Returns:
            The ``offloadd.v1.Job``.

        Raises:
            NotFound: no such job.
        """
        return await self._call(self._jobs.GetJob, job_service_pb2.GetJobRequest(job_id=job_id))

    async def list_jobs(self, states: Any = (), page_size: int = 0) -> AsyncIterator[job_pb2.Job]:
        """Yields every job, all pages, optionally only those in some states (``async for``).

        Args:
            states: a state or an iterable of states: ``JobState`` members, names or numbers.
            page_size: jobs per request (0: the daemon's default).

        Yields:
            ``offloadd.v1.Job`` messages.
        """
        token = ""
        while True:
            resp = await self._call(self._jobs.ListJobs, _shared.list_jobs_request(states, page_size, token))
            for job in resp.jobs:
                yield job
            token = resp.next_page_token
            if not token:
                return

    async def cancel_job(self, job_id: str, reason: str = "", force: bool = False) -> job_pb2.Job:
        """Cancels a job (as ``Client.cancel_job``).

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
        return await self._call(self._jobs.CancelJob, request)

    async def pause_job(self, job_id: str) -> job_pb2.Job:
        """Pauses a running job (as ``Client.pause_job``).

        Args:
            job_id: the job's id.

        Returns:
            The job after the request.
        """
        return await self._call(self._jobs.PauseJob, job_service_pb2.PauseJobRequest(job_id=job_id))

    async def delete_job(self, job_id: str) -> job_pb2.Job:
        """Removes a job that ended from the daemon's records (as ``Client.delete_job``).

        Args:
            job_id: the job's id.

        Returns:
            The job as it was.
        """
        return await self._call(self._jobs.DeleteJob, job_service_pb2.DeleteJobRequest(job_id=job_id))

    async def resume_job(self, job_id: str) -> job_pb2.Job:
        """Queues a paused job again (as ``Client.resume_job``).

        Args:
            job_id: the job's id.

        Returns:
            The job after the request.
        """
        return await self._call(self._jobs.ResumeJob, job_service_pb2.ResumeJobRequest(job_id=job_id))

    async def list_checkpoints(self, job_id: str):
        """The job's checkpoints, oldest first (as ``Client.list_checkpoints``).

        Args:
            job_id: the job's id.

        Returns:
            A sequence of ``offloadd.v1.Checkpoint``.
        """
        resp = await self._call(self._jobs.ListCheckpoints, job_service_pb2.ListCheckpointsRequest(job_id=job_id))
        return resp.checkpoints

    async def list_metrics(self, job_id: str, *, after_step: Optional[int] = None,
                           limit: int = 0) -> job_service_pb2.ListJobMetricsResponse:
        """One page of the job's metrics history (as ``Client.list_metrics``).

        Args:
            job_id: the job's id.
            after_step: rows of later steps only; ``None``: from the first row.
            limit: rows per page; 0: 1000, at most 10000.

        Returns:
            An ``offloadd.v1.ListJobMetricsResponse``: ``metrics``, ``has_more``, ``capped``.
        """
        return await self._call(self._jobs.ListJobMetrics, _shared.list_metrics_request(job_id, after_step, limit))

    async def iter_metrics(self, job_id: str, *, after_step: Optional[int] = None,
                           page_size: int = 0) -> AsyncIterator[job_pb2.StepMetrics]:
        """Every row of the job's metrics history after ``after_step`` (``async for``; as
        ``Client.iter_metrics``).

        Args:
            job_id: the job's id.
            after_step: rows of later steps only; ``None``: from the first row.
            page_size: rows per ``ListJobMetrics`` call; 0: 1000, at most 10000.

        Yields:
            ``offloadd.v1.StepMetrics`` rows, in step order.
        """
        while True:
            page = await self.list_metrics(job_id, after_step=after_step, limit=page_size)
            for row in page.metrics:
                yield row
            if not page.has_more or not page.metrics:
                return
            after_step = page.metrics[-1].step

    async def list_events(self, job_id: str, *, limit: int = 0, after: int = 0, include_progress: bool = True,
                          include_logs: bool = True) -> job_service_pb2.ListJobEventsResponse:
        """One page of the job's events, oldest first (as ``Client.list_events``).

        Args:
            job_id: the job's id.
            limit: events per page; 0: 100, at most 1000 (a page also stops at about 1 MiB).
            after: events after this cursor (0: from the first); pass the page's
                ``next_after`` to get the next page.
            include_progress: include the per-step progress events.
            include_logs: include log events.

        Returns:
            An ``offloadd.v1.ListJobEventsResponse``: ``events``, ``has_more``, ``next_after``.
        """
        return await self._call(self._jobs.ListJobEvents,
                                _shared.list_events_request(job_id, after, limit, include_progress, include_logs))

    async def watch_job(self, job_id: str, after_cursor: int = 0) -> AsyncIterator[job_pb2.JobEvent]:
        """Streams the job's events until it ends (``async for``; no reconnect: ``wait`` has that).

        Args:
            job_id: the job's id.
            after_cursor: start after this event's cursor (0: from the first event).

        Yields:
            ``offloadd.v1.JobEvent`` messages.
        """
        call = self._jobs.WatchJob(job_service_pb2.WatchJobRequest(job_id=job_id, after_cursor=after_cursor))
        try:
            async for event in call:
                yield event
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None
        finally:
            call.cancel()
