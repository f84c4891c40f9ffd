"""An in-process fake JobService on a Unix socket: scripted events for one job, and streams that
break on purpose, to test Client.wait / AsyncClient.wait without the daemon. It also answers the
grpc.health.v1 service (SERVING), and can serve over TLS demanding a bearer token."""

from __future__ import annotations

import os
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
                 hang_at_end=False, refuse=None, known_jobs=None, job=None, jobs=None, create_violations=None,
                 checkpoints=None):
        self.events = events
        self.final_state = final_state
        self.break_calls = break_calls
        self.break_after = break_after
        self.hang_at_end = hang_at_end
        self.refuse = refuse  # (grpc.StatusCode, message) answered to every WatchJob
        self.known_jobs = known_jobs  # job ids GetJob/CancelJob/WatchJob know; None: all
        self.job = job  # what GetJob answers (its id and state set per call); None: a bare Job
        self.jobs = jobs  # what ListJobs pages through; None: one job in final_state
        self.create_violations = create_violations  # [(field, description)]: CreateJob's BadRequest
        self.checkpoints = checkpoints or []  # what ListCheckpoints answers
        self.deleted: list[str] = []  # job ids of DeleteJob calls that succeeded
        self.cursors: list[int] = []
        self.watch_requests: list = []
        self.cancelled: list[tuple[str, str]] = []
        self.forced: list[str] = []  # job ids of CancelJob calls with force
        self._lock = threading.Lock()

    def WatchJob(self, request, context):
        with self._lock:
            self.cursors.append(request.after_cursor)
            self.watch_requests.append(request)
            call = len(self.cursors)
        if self.refuse:
            context.abort(*self.refuse)
        self._check_known(request.job_id, context)
        breaks = call <= self.break_calls
        sent = 0
        for e in self.events:
            if e.cursor <= request.after_cursor:
                continue
            if request.HasField("include_progress") and not request.include_progress and e.HasField("progress"):
                continue
            if breaks and sent == self.break_after:
                context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (test)")
            yield e
            sent += 1
        if breaks:
            context.abort(grpc.StatusCode.UNAVAILABLE, "connection reset (test)")
        while self.hang_at_end and not request.until_now and context.is_active():
            time.sleep(0.01)

    def _check_known(self, job_id, context):
        if self.known_jobs is not None and job_id not in self.known_jobs:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} not found")

    def GetJob(self, request, context):
        self._check_known(request.job_id, context)
        job = job_pb2.Job()
        if self.job is not None:
            job.CopyFrom(self.job)
        job.id, job.state = request.job_id, self.final_state
        return job

    def CancelJob(self, request, context):
        self._check_known(request.job_id, context)
        self.cancelled.append((request.job_id, request.reason))
        if request.force:
            self.forced.append(request.job_id)
        return job_pb2.Job(id=request.job_id, state=job_pb2.JOB_STATE_CANCELLED)

    def ListJobs(self, request, context):
        from offloadd.v1 import job_service_pb2
        jobs = self.jobs if self.jobs is not None else [job_pb2.Job(id="job-1", state=self.final_state)]
        jobs = [j for j in jobs if not request.states or j.state in request.states]
        if request.page_size <= 0:
            return job_service_pb2.ListJobsResponse(jobs=jobs)
        start = int(request.page_token or 0)
        end = start + request.page_size
        return job_service_pb2.ListJobsResponse(jobs=jobs[start:end], next_page_token=str(end) if end < len(jobs) else "")

    def CreateJob(self, request, context):
        if self.create_violations:
            from google.protobuf import any_pb2
            from google.rpc import code_pb2, error_details_pb2, status_pb2
            from grpc_status import rpc_status
            bad = error_details_pb2.BadRequest(field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d) for f, d in self.create_violations])
            detail = any_pb2.Any()
            detail.Pack(bad)
            # As the daemon words it: the count, then the first three problems inline.
            n = len(self.create_violations)
            message = f"{n} problem{'' if n == 1 else 's'} in the job spec: " + "; ".join(
                f"{f}: {d}" for f, d in self.create_violations[:3]) + ("; ..." if n > 3 else "")
            context.abort_with_status(rpc_status.to_status(status_pb2.Status(
                code=code_pb2.INVALID_ARGUMENT, message=message, details=[detail])))
        return job_pb2.Job(id="job-1", spec=request.spec, state=job_pb2.JOB_STATE_QUEUED)

    def DeleteJob(self, request, context):
        self._check_known(request.job_id, context)
        if self.final_state not in (job_pb2.JOB_STATE_SUCCEEDED, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_CANCELLED):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"job {request.job_id} has not ended; cancel it first")
        self.deleted.append(request.job_id)
        return self.GetJob(request, context)

    def ListCheckpoints(self, request, context):
        from offloadd.v1 import job_service_pb2
        self._check_known(request.job_id, context)
        return job_service_pb2.ListCheckpointsResponse(checkpoints=self.checkpoints)

    def PauseJob(self, request, context):
        self._check_known(request.job_id, context)
        return job_pb2.Job(id=request.job_id, state=job_pb2.JOB_STATE_PAUSING)

    def ResumeJob(self, request, context):
        self._check_known(request.job_id, context)
        return job_pb2.Job(id=request.job_id, state=job_pb2.JOB_STATE_QUEUED)


class _RequireToken(grpc.ServerInterceptor):
    """Refuses calls without "authorization: Bearer <token>" (UNAUTHENTICATED), as the daemon's TCP
    listener does; records the headers it saw."""

    def __init__(self, token: str):
        self.expected = f"Bearer {token}"
        self.seen: list[str] = []

    def intercept_service(self, continuation, details):
        got = dict(details.invocation_metadata).get("authorization", "")
        self.seen.append(got)
        if got == self.expected:
            return continuation(details)

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "invalid bearer token (test)")

        handler = continuation(details)
        if handler is not None and handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(refuse)
        return grpc.unary_unary_rpc_method_handler(refuse)


class FakeServer:
    """Serves `service` (and grpc.health.v1, SERVING) on unix:<dir>/fake.sock until stop(); with
    tls=(cert_pem, key_pem, token), on 127.0.0.1:<free port> over TLS, demanding the token."""

    def __init__(self, service: FakeJobService, directory, tls=None):
        from grpc_health.v1 import health, health_pb2, health_pb2_grpc
        self.service = service
        self.path = f"{directory}/fake.sock"
        n = 1
        while os.path.exists(self.path):  # several servers in one test directory
            self.path = f"{directory}/fake{n}.sock"
            n += 1
        self.auth = _RequireToken(tls[2]) if tls else None
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                   interceptors=[self.auth] if self.auth else [])
        job_service_pb2_grpc.add_JobServiceServicer_to_server(service, self._server)
        health_servicer = health.HealthServicer()
        health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, self._server)
        if tls:
            cert, key, _ = tls
            creds = grpc.ssl_server_credentials([(key, cert)])
            self.port = self._server.add_secure_port("127.0.0.1:0", creds)
            self._target = f"127.0.0.1:{self.port}"
        else:
            if self._server.add_insecure_port(f"unix:{self.path}") == 0:
                raise RuntimeError(f"fake JobService cannot bind unix:{self.path}")
            self._target = f"unix://{self.path}"
        self._server.start()

    @property
    def target(self) -> str:
        return self._target

    def stop(self) -> None:
        self._server.stop(grace=None)
