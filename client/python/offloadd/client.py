"""A small typed wrapper over offloadd's gRPC API (Unix socket or TCP + TLS + bearer token)."""

from __future__ import annotations

import os
from typing import Iterator, Optional, Union

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from offloadd.errors import from_rpc_error
from offloadd.job_file import job_spec
from offloadd.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc, node_service_pb2, node_service_pb2_grpc

DEFAULT_TARGET = "unix:///run/offloadd/offloadd.sock"


class _BearerToken(grpc.AuthMetadataPlugin):
    def __init__(self, token: str):
        self._header = f"Bearer {token}"

    def __call__(self, context, callback):
        callback((("authorization", self._header),), None)


class Client:
    """Connects to offloadd. Thread-safe; use as a context manager or call close().

    target: "unix:///path.sock" (default: $OFFLOADD_TARGET or DEFAULT_TARGET) or "host:port".
    TCP targets need tls_ca_file and token_file: the daemon serves TCP only with TLS and a token.
    """

    def __init__(
        self,
        target: Optional[str] = None,
        *,
        tls_ca_file: Optional[str] = None,
        token_file: Optional[str] = None,
        tls_server_name: Optional[str] = None,
        timeout: float = 30.0,
    ):
        self.target = target or os.environ.get("OFFLOADD_TARGET") or DEFAULT_TARGET
        self.timeout = timeout
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
        a YAML job file. Raises InvalidArgument with .field_violations listing every problem."""
        req = job_service_pb2.CreateJobRequest(spec=job_spec(spec), validate_only=validate_only, request_id=request_id)
        return self._call(self._jobs.CreateJob, req)

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
