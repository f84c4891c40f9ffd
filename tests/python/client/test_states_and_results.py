"""The sync client: job states as strings (offloadd.JobState) wherever the SDK gives
or takes a state, and the result object (offloadd.JobResult, OpenAI/Vertex-like) of succeeded,
failed and cancelled jobs, against the fake JobService."""

from __future__ import annotations

import datetime
import json
import pathlib
import sys

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fake_job_service import FakeJobService, FakeServer, scripted_events  # noqa: E402

import offloadd  # noqa: E402
from offloadd import JobState  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402


@pytest.fixture()
def serve(tmp_path):
    servers = []

    def start(service: FakeJobService, **client_args) -> offloadd.Client:
        server = FakeServer(service, tmp_path)
        servers.append(server)
        return offloadd.Client(server.target, **client_args)

    yield start
    for s in servers:
        s.stop()


def log_event(cursor: int, message: str, job_id: str = "job-1") -> job_pb2.JobEvent:
    e = job_pb2.JobEvent(cursor=cursor, job_id=job_id)
    e.log.level = job_pb2.LOG_LEVEL_INFO
    e.log.message = message
    return e


def ended_events(final: int, *logs: str) -> list:
    """RUNNING, 3 progress steps, the given log lines, then `final`."""
    events = scripted_events()[:-1]
    for text in logs:
        events.append(log_event(len(events) + 1, text))
    last = job_pb2.JobEvent(cursor=len(events) + 1, job_id="job-1")
    last.state_change.state = final
    events.append(last)
    return events


def finished_job(output_dir="/srv/out/demo", tokens=1234, error=None) -> job_pb2.Job:
    job = job_pb2.Job()
    job.spec.display_name = "demo"
    job.spec.output_dir = output_dir
    job.progress.step, job.progress.max_steps, job.progress.tokens_seen = 3, 3, tokens
    job.progress.loss, job.progress.epoch = 0.75, 0.5
    job.create_time.seconds, job.start_time.seconds, job.end_time.seconds = 1_700_000_000, 1_700_000_010, 1_700_000_070
    job.latest_checkpoint_step = 2
    if error:
        job.error.code, job.error.message = error
    return job


# --- JobState -------------------------------------------------------------------------------
def test_states_read_and_print_as_lower_case_names():
    assert [s.value for s in JobState] == [
        job_pb2.JobState.Name(n).removeprefix("JOB_STATE_").lower() for n in job_pb2.JobState.values()]
    assert JobState.RUNNING == "running" and str(JobState.RUNNING) == "running" and f"{JobState.FAILED}" == "failed"
    assert json.dumps({"status": JobState.SUCCEEDED}) == '{"status": "succeeded"}'
    for written in ("running", "RUNNING", "Running", "JOB_STATE_RUNNING", "job_state_running", 3, JobState.RUNNING):
        assert JobState.parse(written) is JobState.RUNNING, written
    assert all(JobState.parse(s.proto) is s for s in JobState)
    assert {s for s in JobState if s.is_final} == {"succeeded", "failed", "cancelled"}
    assert {s.proto for s in JobState if s.is_final} == offloadd.FINAL_STATES


def test_state_of_messages():
    assert JobState.of(job_pb2.Job(state=job_pb2.JOB_STATE_QUEUED)) == "queued"
    assert JobState.of(scripted_events()[0]) == "running"
    assert JobState.of(scripted_events()[1]) == "unspecified", "a progress event carries no state"
    assert JobState.of(job_pb2.StateTransition(state=job_pb2.JOB_STATE_PAUSED)) == "paused"


def test_unknown_state_names_say_what_is_valid():
    with pytest.raises(ValueError, match=r"unknown job state 'runing' \(one of: unspecified, .*\); did you mean 'running'"):
        JobState.parse("runing")
    with pytest.raises(ValueError, match="42 is no offloadd.v1.JobState number"):
        JobState.parse(42)
    with pytest.raises(TypeError):
        JobState.parse(1.5)


def test_list_jobs_takes_states_as_strings(serve):
    jobs = [job_pb2.Job(id=f"j{i}", state=s) for i, s in enumerate(
        [job_pb2.JOB_STATE_QUEUED, job_pb2.JOB_STATE_RUNNING, job_pb2.JOB_STATE_FAILED, job_pb2.JOB_STATE_RUNNING])]
    with serve(FakeJobService([], jobs=jobs)) as c:
        assert [j.id for j in c.list_jobs(states=["running", "JOB_STATE_QUEUED"])] == ["j0", "j1", "j3"]
        assert [j.id for j in c.list_jobs(states="failed")] == ["j2"], "one state, not its letters"
        assert [j.id for j in c.list_jobs(states=[JobState.RUNNING], page_size=1)] == ["j1", "j3"]
        assert [j.id for j in c.list_jobs(states=[job_pb2.JOB_STATE_FAILED])] == ["j2"], "numbers still work"
        assert [JobState.of(j) for j in c.list_jobs()] == ["queued", "running", "failed", "running"]
        with pytest.raises(ValueError, match="did you mean 'queued'"):
            list(c.list_jobs(states=["queud"]))


def test_wait_timeout_names_the_last_state(serve):
    with serve(FakeJobService(scripted_events()[:-1], hang_at_end=True)) as c:
        with pytest.raises(offloadd.WaitTimeout) as e:
            c.wait("job-1", timeout=0.3)
    assert e.value.last_status == "running" and e.value.last_state == job_pb2.JOB_STATE_RUNNING


# --- JobResult ------------------------------------------------------------------------------
def test_result_of_a_succeeded_job(serve):
    events = ended_events(job_pb2.JOB_STATE_SUCCEEDED, "final model written to /srv/out/demo",
                          "finished 3 steps, final loss 0.712500; model in /srv/out/demo")
    service = FakeJobService(events, job=finished_job())
    with serve(service) as c:
        r = c.result("job-1", raise_on_failure=True)
    assert isinstance(r, offloadd.JobResult)
    assert r.id == "job-1" and r.status == "succeeded" and r.status is JobState.SUCCEEDED
    assert r.succeeded and r.done
    assert r.fine_tuned_model == "/srv/out/demo" and r.output_dir == "/srv/out/demo"
    assert r.trained_tokens == 1234 and r.steps == 3 and r.max_steps == 3 and r.epoch == 0.5
    assert r.final_loss == pytest.approx(0.7125), "the job's own final loss, not the last report's"
    assert r.error is None and r.error_code is None
    utc = datetime.timezone.utc
    assert r.created_at == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=utc)
    assert r.finished_at - r.started_at == datetime.timedelta(seconds=60)
    assert r.latest_checkpoint_step == 2 and r.job.spec.display_name == "demo"
    assert r.raise_for_status() is r
    d = r.to_dict()
    assert d["status"] == "succeeded" and d["created_at"] == "2023-11-14T22:13:20+00:00" and "job" not in d
    json.dumps(d)
    # Only the log matters to the result: the progress events are not asked for.
    assert [req.HasField("include_progress") and not req.include_progress for req in service.watch_requests] == [True]


def test_result_follows_the_daemons_log_for_the_model_directory(serve):
    # The log names where the model went (e.g. a subdirectory of output_dir): that wins.
    events = ended_events(job_pb2.JOB_STATE_SUCCEEDED, "finished 3 steps, final loss 0.5; model in /srv/out/demo/model")
    with serve(FakeJobService(events, job=finished_job())) as c:
        assert c.result("job-1").fine_tuned_model == "/srv/out/demo/model"
    # No log seen (e.g. an older daemon): the model is in output_dir, where the daemon exports it.
    with serve(FakeJobService(ended_events(job_pb2.JOB_STATE_SUCCEEDED), job=finished_job())) as c:
        r = c.result("job-1")
        assert r.fine_tuned_model == "/srv/out/demo" and r.final_loss == 0.75, "the last progress report's loss"
    # The job finished without exporting (a random-init model): no model.
    events = ended_events(job_pb2.JOB_STATE_SUCCEEDED, "finished 3 steps, final loss 0.5")
    with serve(FakeJobService(events, job=finished_job())) as c:
        assert c.result("job-1").fine_tuned_model is None


def test_result_of_a_failed_job(serve):
    events = ended_events(job_pb2.JOB_STATE_FAILED, "CUDA out of memory")
    job = finished_job(error=(grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], "GPU out of memory at step 3"))
    with serve(FakeJobService(events, final_state=job_pb2.JOB_STATE_FAILED, job=job)) as c:
        r = c.result("job-1")
        assert r.status == "failed" and not r.succeeded and r.done
        assert r.fine_tuned_model is None, "a failed job has no fine-tuned model"
        assert r.error == "GPU out of memory at step 3" and r.error_code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert r.to_dict()["error_code"] == "RESOURCE_EXHAUSTED"
        with pytest.raises(offloadd.JobFailed) as e:
            c.result("job-1", raise_on_failure=True)
        with pytest.raises(offloadd.JobFailed):
            c.wait("job-1", raise_on_failure=True)
        assert c.wait("job-1").state == job_pb2.JOB_STATE_FAILED, "wait returns it unless asked to raise"
    err = e.value
    assert isinstance(err, offloadd.JobError) and isinstance(err, offloadd.OffloaddError)
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED and err.job_id == "job-1" and err.status == "failed"
    assert err.message == "job job-1 failed: GPU out of memory at step 3" and err.result.trained_tokens == 1234


def test_result_of_a_cancelled_job(serve):
    events = ended_events(job_pb2.JOB_STATE_CANCELLED)
    job = finished_job(error=(grpc.StatusCode.CANCELLED.value[0], "cancelled by alice"))
    with serve(FakeJobService(events, final_state=job_pb2.JOB_STATE_CANCELLED, job=job)) as c:
        r = c.result("job-1")
        assert r.status == "cancelled" and r.error == "cancelled by alice" and r.fine_tuned_model is None
        with pytest.raises(offloadd.JobCancelled) as e:
            c.result("job-1", raise_on_failure=True)
    assert e.value.code == grpc.StatusCode.CANCELLED and "job job-1 was cancelled: cancelled by alice" in str(e.value)
    assert not isinstance(e.value, offloadd.JobFailed)


def test_result_without_waiting(serve):
    service = FakeJobService(scripted_events(), final_state=job_pb2.JOB_STATE_RUNNING, job=finished_job(tokens=99))
    with serve(service) as c:
        r = c.result("job-1", wait=False, raise_on_failure=True)
    assert r.status == "running" and not r.done and r.fine_tuned_model is None and r.trained_tokens == 99
    assert service.cursors == [], "no watch for a job still running"
    assert offloadd.JobResult.from_job(job_pb2.Job(id="x", state=job_pb2.JOB_STATE_QUEUED)).final_loss is None


def test_result_passes_events_on_and_raises_not_found(serve):
    seen = []
    service = FakeJobService(ended_events(job_pb2.JOB_STATE_SUCCEEDED), job=finished_job(), known_jobs={"job-1"})
    with serve(service) as c:
        assert c.result("job-1", on_event=lambda e: seen.append(e.cursor)).succeeded
        with pytest.raises(offloadd.NotFound):
            c.result("nope")
    assert seen == [1, 2, 3, 4, 5]
    assert not service.watch_requests[0].HasField("include_progress"), "progress wanted by on_event"
