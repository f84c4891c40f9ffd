"""A job reads and writes only under the daemon's allowed_roots, whatever symlinks
its model or output directory holds, and even when its output directory is swapped for a symlink
after CreateJob validated it. Each case used to read or write outside the roots."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
from daemon_process import DaemonProcess, pretokenized_spec, tiny_assets  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return tiny_assets(tmp_path_factory.mktemp("assets"))


@pytest.fixture()
def roots(tmp_path, assets):
    """(root, outside): the daemon's only allowed root, and a directory beside it."""
    model, data = assets
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    shutil.copytree(model, root / "model")
    shutil.copy(data, root / "data.jsonl")
    (outside / "secret.json").write_text('{"secret": "outside the roots"}')
    (outside / "victim").write_text("victim")
    return root, outside


@pytest.fixture()
def daemon(binary_dir, roots):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", roots[0]).start()
    yield d
    d.stop()


spec = pretokenized_spec


def test_symlink_in_model_dir_leading_out_of_the_roots_is_not_exported(daemon, roots):
    root, outside = roots
    link = root / "model" / "generation_config.json"
    link.unlink(missing_ok=True)
    link.symlink_to(outside / "secret.json")
    # CreateJob opens every model file the job will: refused there, naming the link.
    # One swapped in after CreateJob fails the job (test_job_file_confinement.py).
    with offloadd.Client(daemon.target) as c:
        with pytest.raises(offloadd.OffloaddError) as e:
            c.submit(spec(root, "out"), wait=True, timeout=120)
    exported = root / "out" / "generation_config.json"
    assert not (exported.exists() and "outside the roots" in exported.read_text()), "a file from outside the roots was exported"
    assert e.value.code.name == "INVALID_ARGUMENT", e.value
    assert str(link) in str(e.value) and "allowed root" in str(e.value), str(e.value)


def test_symlinks_in_the_output_dir_are_replaced_not_written_through(daemon, roots):
    root, outside = roots
    out = root / "out"
    out.mkdir()
    for name in ("config.json", "model.safetensors", "model.safetensors.tmp", "tokenizer.json"):
        (out / name).symlink_to(outside / "victim")
    with offloadd.Client(daemon.target) as c:
        done = c.submit(spec(root, "out"), wait=True, timeout=120)
    assert (outside / "victim").read_text() == "victim", "the export wrote through a symlink"
    assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, daemon.log()[-2000:])
    assert not (out / "config.json").is_symlink() and not (out / "model.safetensors").is_symlink()


def test_queued_jobs_output_dir_replaced_by_a_symlink_is_refused(daemon, roots):
    root, outside = roots
    (outside / "dir").mkdir()
    with offloadd.Client(daemon.target) as c:
        # A slow job ahead keeps the second one queued while its output directory is swapped.
        first = c.create_job(spec(root, "first", steps=30, accum=4))
        second = c.create_job(spec(root, "second", steps=4, save_steps=2))
        assert c.get_job(second.id).state == S.JOB_STATE_QUEUED
        os.symlink(outside / "dir", root / "second")
        done = c.wait(second.id, timeout=180)
        c.wait(first.id, timeout=180)
    assert sorted(os.listdir(outside / "dir")) == [], "the job wrote outside the allowed roots"
    assert done.state == S.JOB_STATE_FAILED, (S.JobState.Name(done.state), daemon.log()[-2000:])
    assert str(root / "second") in done.error.message and "symbolic link" in done.error.message, done.error.message
