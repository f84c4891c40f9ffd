"""An in-process fake JobService on a Unix socket: scripted events for one job, and streams that
break on purpose, to test Client.wait without the daemon."""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc

from offloadd.v1 import job_pb2, job_service_pb2_grpc


def scripted_events(job_id: str = "job-1") -> list[job_pb2.JobEvent]:
    """RUNNING, progress steps 1..3, SUCCEEDED: cursors 1..5, one second apart."""
    events = []
    for c in range(1, 6):
        e = job_pb2.JobEvent(cursor=c, job_id=job_id)
        e.time.seconds = 1000 + c
        if c == 1:
            e.state_change.state = job_pb2.JOB_STATE_RUNNING
            e.state_change.reason = "started"
        elif c == 5:
            e.state_change.state = job_pb2.JOB_STATE_SUCCEEDED
            e.state_change.reason = "finished"
        else:
            e.progress.step = c - 1
            e.progress.max_steps = 3
            e.progress.loss = 2.0 / c
        events.append(e)
    return events


class FakeJobService(job_service_pb2_grpc.JobServiceServicer):
    """Each WatchJob call sends the events after its cursor; the first `break_calls` calls stop
    with UNAVAILABLE after `break_after` events, as a restarting daemon would."""

    def __init__(self, events, *, final_state=job_pb2.JOB_STATE_SUCCEEDED, break_calls=0, break_after=0,
                 hang_at_end=False, refuse=None, known_jobs=None):
        self.events = events
        self.final_state = final_state
        self.break_calls = break_calls
        self.break_after = break_after
        self.hang_at_end = hang_at_end
        self.refuse = refuse  # (grpc.StatusCode, message) answered to every WatchJob
        self.known_jobs = known_jobs  # job ids GetJob/CancelJob/WatchJob know; None: all
        self.cursors: list[int] = []
        self.cancelled: list[tuple[str, str]] = []
        self._lock = threading.Lock()

    def WatchJob(self, request, context):
        with self._lock:
            self.cursors.append(request.after_cursor)
            call = len(self.cursors)
        if self.refuse:
            context.abort(*self.refuse)
        self._check_known(request.job_id, context)
        breaks = call <= self.break_calls
        sent = 0
        for e in self.events:
            if e.cursor <= request.after_cursor:
                continue
            if breaks and sent == self.break_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (test)")
            yield e
            sent += 1
        if breaks:
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (test)")
        while self.hang_at_end and context.is_active():
            time.sleep(0.01)

    def _check_known(self, job_id, context):
        if self.known_jobs is not None and job_id not in self.known_jobs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} not found")

    def GetJob(self, request, context):
        self._check_known(request.job_id, context)
        return job_pb2.Job(id=request.job_id, state=self.final_state)

    def CancelJob(self, request, context):
        self._check_known(request.job_id, context)
        self.cancelled.append((request.job_id, request.reason))
        return job_pb2.Job(id=request.job_id, state=job_pb2.JOB_STATE_CANCELLED)

    def ListJobs(self, request, context):
        from offloadd.v1 import job_service_pb2
        jobs = [job_pb2.Job(id="job-1", state=self.final_state)]
        jobs = [j for j in jobs if not request.states or j.state in request.states]
        return job_service_pb2.ListJobsResponse(jobs=jobs)

    def CreateJob(self, request, context):
        return job_pb2.Job(id="job-1", spec=request.spec, state=job_pb2.JOB_STATE_QUEUED)


class FakeServer:
    """Serves `service` on unix:<dir>/fake.sock until stop()."""

    def __init__(self, service: FakeJobService, directory):
        self.service = service
        self.path = f"{directory}/fake.sock"
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        job_service_pb2_grpc.add_JobServiceServicer_to_server(service, self._server)
        if self._server.add_insecure_port(f"unix:{self.path}") == 0:
            raise RuntimeError(f"fake JobService cannot bind unix:{self.path}")
        self._server.start()

    @property
    def target(self) -> str:
        return f"unix://{self.path}"

    def stop(self) -> None:
        self._server.stop(grace=None)
