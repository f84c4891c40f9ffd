"""Through the real daemon: job records are bounded and ListJobs pages by bytes.

Before, a job record could reach 2.1 MB (256 dataset and 256 eval paths of 4 KB); with 8 such jobs
one ListJobs response passed gRPC's 4 MiB limit and `offloadctl list` failed for everyone. Now
CreateJob refuses a spec over 256 KiB naming the limit, and a ListJobs page ends at 1 MiB of
records, so 20 jobs at the largest allowed size (4.8 MB together) list through the SDK and
offloadctl, which follow the page tokens."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from test_training_jobs import assets, spec, workspace  # noqa: E402,F401

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2, job_service_pb2  # noqa: E402

S = job_pb2
LIMIT = 256 << 10


def deep_dir(root: pathlib.Path, length: int) -> pathlib.Path:
    """A directory whose path is about `length` bytes long (names of 200 bytes)."""
    d = root
    while len(str(d)) < length - 250:
        d = d / ("d" * 200)
    d.mkdir(parents=True)
    return d


def big_spec(ws: pathlib.Path, files: list[pathlib.Path], name: str) -> dict:
    s = spec(ws, name, steps=1, save_steps=10)
    s["dataset"]["paths"] = [str(f) for f in files]
    return s


@pytest.fixture()
def data_files(workspace):
    d = deep_dir(workspace / "data", 3800)
    files = []
    for i in range(62):  # 62 paths of ~3.9 KB: a spec just under the 256 KiB limit
        f = d / f"part-{i:04d}.jsonl"
        shutil.copy(workspace / "data.jsonl", f)
        files.append(f)
    return files


def test_a_spec_over_the_record_limit_is_refused_naming_it(binary_dir, workspace, data_files):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        with offloadd.Client(d.target) as c:
            s = big_spec(workspace, data_files, "huge")
            s["dataset"]["eval_paths"] = [str(f) for f in data_files]  # twice the size: over the limit
            with pytest.raises(offloadd.OffloaddError) as e:
                c.create_job(s)
            assert "spec" in str(e.value) and str(LIMIT) in str(e.value), str(e.value)
    finally:
        d.stop()


def test_many_large_jobs_list_in_pages_through_the_sdk_and_offloadctl(binary_dir, workspace, data_files):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        with offloadd.Client(d.target) as c:
            ids = []
            for i in range(20):
                job = c.create_job(big_spec(workspace, data_files, f"big-{i}"))
                assert LIMIT - 32768 < job.spec.ByteSize() <= LIMIT, job.spec.ByteSize()
                ids.append(job.id)
            total = sum(c.get_job(i).ByteSize() for i in ids)
            assert total > 4 << 20, total  # more than one gRPC message could hold

            # One raw request: a page ends at about 1 MiB, with a token for the rest.
            first = c._call(c._jobs.ListJobs, job_service_pb2.ListJobsRequest(page_size=1000))
            assert 0 < len(first.jobs) < 20 and first.next_page_token
            assert first.ByteSize() < 2 << 20, first.ByteSize()

            assert [j.id for j in c.list_jobs()] == ids  # the SDK follows the tokens

        ctl = binary_dir / "client" / "offloadctl"
        r = subprocess.run([str(ctl), "--target", d.target, "list"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        listed = [line.split()[0] for line in r.stdout.splitlines()[1:] if line.startswith("job-")]
        assert listed == ids, r.stdout
        assert "more:" not in r.stdout
    finally:
        d.stop()
