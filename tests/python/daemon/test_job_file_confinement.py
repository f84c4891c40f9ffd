"""Every file a job opens goes through the confined open, also the
model files each checkpoint copies, and only regular files are opened.

- A symlink out of the roots in the model directory (generation_config.json -> a 0600 token file
  outside) was copied, mode 0644, into every checkpoint: now CreateJob refuses it naming the file,
  and one swapped in after CreateJob fails the job at its checkpoint, naming it, copying nothing.
- A FIFO there passed CreateJob and hung the job at its first checkpoint for good (RUNNING forever,
  cancel stuck in CANCELLING, the queue blocked): now CreateJob refuses it, and one swapped in after
  CreateJob fails the job at once.
- A parent of a queued job's output_dir swapped for a symlink out of the roots made the executor's
  plain mkdir -p create the directory outside: now the job fails before training, naming it.
- With the daemon running as root, a job's files are opened with its submitter's rights: a hard link
  to a file that user cannot read is refused, and what the job writes is the user's."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
from daemon_process import DaemonProcess, pretokenized_spec, tiny_assets  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2
SECRET = "s3cret-token-outside-the-roots"


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    model, data = tiny_assets(tmp_path_factory.mktemp("assets"))
    (model / "generation_config.json").write_text('{"bos_token_id": 0, "eos_token_id": 0}\n')
    return model, data


@pytest.fixture()
def roots(tmp_path, assets):
    """(root, outside): the daemon's only allowed root, and a directory beside it with a token file."""
    model, data = assets
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    for name in ("m", "m-link", "m-fifo"):
        shutil.copytree(model, root / name)
    shutil.copy(data, root / "data.jsonl")
    token = outside / "token-file"
    token.write_text(SECRET + "\n")
    token.chmod(0o600)
    (outside / "dir").mkdir()
    return root, outside


@pytest.fixture()
def daemon(binary_dir, roots):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", roots[0]).start()
    yield d
    d.stop()


def spec(root: pathlib.Path, out: str, *, model: str = "m", steps: int = 4, save_steps: int = 2,
         accum: int = 1) -> dict:
    return pretokenized_spec(root, out, model=model, steps=steps, save_steps=save_steps, accum=accum)


def leaked(root: pathlib.Path) -> list[str]:
    """Files under root holding the outside token (a checkpoint's copy of it)."""
    found = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = pathlib.Path(dirpath) / f
            if p.is_file() and not p.is_symlink() and p.stat().st_size < 1 << 20 and SECRET in p.read_text(errors="replace"):
                found.append(str(p))
    return found


def test_a_symlink_or_fifo_in_the_model_dir_is_refused_at_create_job(daemon, roots):
    root, outside = roots
    link = root / "m-link" / "generation_config.json"
    link.unlink()
    link.symlink_to(outside / "token-file")
    fifo = root / "m-fifo" / "generation_config.json"
    fifo.unlink()
    os.mkfifo(fifo)
    with offloadd.Client(daemon.target, timeout=20) as c:
        with pytest.raises(offloadd.OffloaddError) as e:
            c.create_job(spec(root, "out-link", model="m-link"))
        assert e.value.code.name == "INVALID_ARGUMENT", e.value
        assert str(link) in str(e.value) and "allowed root" in str(e.value), str(e.value)
        with pytest.raises(offloadd.OffloaddError) as e:
            c.create_job(spec(root, "out-fifo", model="m-fifo"))
        assert e.value.code.name == "INVALID_ARGUMENT", e.value
        assert str(fifo) in str(e.value) and "not a regular file (a FIFO)" in str(e.value), str(e.value)
    assert leaked(root) == []


def test_model_files_and_output_parents_swapped_after_create_job_fail_the_job(daemon, roots):
    root, outside = roots
    (root / "out").mkdir()
    with offloadd.Client(daemon.target) as c:
        # A slow job ahead keeps the others queued while their files are swapped.
        first = c.create_job(spec(root, "first", steps=30, accum=4, save_steps=100))
        linked = c.create_job(spec(root, "out-link", model="m-link"))
        fifoed = c.create_job(spec(root, "out-fifo", model="m-fifo"))
        parent = c.create_job(spec(root, "out/p/q"))
        for j in (linked, fifoed, parent):
            assert c.get_job(j.id).state == S.JOB_STATE_QUEUED, S.JobState.Name(c.get_job(j.id).state)
        link = root / "m-link" / "generation_config.json"
        link.unlink()
        link.symlink_to(outside / "token-file")
        fifo = root / "m-fifo" / "generation_config.json"
        fifo.unlink()
        os.mkfifo(fifo)
        (root / "out" / "p").symlink_to(outside / "dir")
        # Each ends on its own: a FIFO used to hang its job (and the queue) for good.
        done = {name: c.wait(j.id, timeout=240) for name, j in
                (("link", linked), ("fifo", fifoed), ("parent", parent))}
        c.wait(first.id, timeout=240)
    log = daemon.log()[-3000:]
    for name, job in done.items():
        assert job.state == S.JOB_STATE_FAILED, (name, S.JobState.Name(job.state), job.error, log)
    msg = done["link"].error.message
    assert str(link) in msg and "allowed root" in msg and "checkpoint" in msg, msg
    msg = done["fifo"].error.message
    assert str(fifo) in msg and "not a regular file (a FIFO)" in msg, msg
    msg = done["parent"].error.message
    assert str(root / "out" / "p") in msg and "symbolic link" in msg, msg
    # Nothing copied out of the roots, nothing created outside them, and no training before the
    # parent was refused.
    assert leaked(root) == []
    assert sorted(os.listdir(outside / "dir")) == [], "the job wrote outside the allowed roots"
    assert done["parent"].progress.step == 0


NOBODY = 65534


@pytest.fixture()
def shared_workspace(assets):
    """A workspace a second user can reach (pytest's tmp_path has 0700 parents): root's model and
    data (world-readable), a root-only secret, and a directory of nobody's own."""
    model, data = assets
    ws = pathlib.Path(tempfile.mkdtemp(prefix="offloadd-rights-"))
    ws.chmod(0o755)
    shutil.copytree(model, ws / "m")
    shutil.copy(data, ws / "data.jsonl")
    for p in ws.rglob("*"):  # world-readable (save_pretrained writes its safetensors 0600)
        p.chmod(0o755 if p.is_dir() else 0o644)
    (ws / "secret").write_text(SECRET + "\n")
    (ws / "secret").chmod(0o600)
    # nobody's model: a hard link to root's secret as its generation_config.json.
    shutil.copytree(model, ws / "m-linked")
    (ws / "m-linked" / "generation_config.json").unlink()
    os.link(ws / "secret", ws / "m-linked" / "generation_config.json")
    (ws / "nobody").mkdir()
    os.chown(ws / "nobody", NOBODY, NOBODY)
    yield ws
    shutil.rmtree(ws, ignore_errors=True)


def submit_as(binary_dir, daemon, ws: pathlib.Path, job: dict, user: int) -> subprocess.CompletedProcess:
    path = ws / f"{job['display_name'].replace('/', '-')}.yaml"
    path.write_text(yaml.safe_dump(job))
    path.chmod(0o644)
    return subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", daemon.target, "-o", "json",
                           "submit", str(path)], capture_output=True, text=True, timeout=120, user=user)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a client as a second user needs root")
def test_a_local_users_job_opens_its_files_with_that_users_rights(binary_dir, shared_workspace):
    ws = shared_workspace
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", ws)
    d.config_path.write_text(d.config_path.read_text().replace('unix_socket_mode: "0600"', 'unix_socket_mode: "0666"'))
    d.start()
    try:
        (ws / "run").chmod(0o755)
        # A hard link to a file nobody cannot read: the kernel refuses it with nobody's rights.
        r = submit_as(binary_dir, d, ws, spec(ws, "nobody/linked", model="m-linked"), NOBODY)
        assert r.returncode != 0, r.stdout
        link = ws / "m-linked" / "generation_config.json"
        assert str(link) in r.stderr and "Permission denied" in r.stderr, r.stderr
        # nobody's own job trains, and what it writes is nobody's.
        r = submit_as(binary_dir, d, ws, spec(ws, "nobody/out"), NOBODY)
        assert r.returncode == 0, r.stdout + r.stderr
        ok_id = json.loads(r.stdout)["id"]
        # One writing into root's directory fails, creating nothing there.
        r = submit_as(binary_dir, d, ws, spec(ws, "out-root"), NOBODY)
        assert r.returncode == 0, r.stdout + r.stderr
        denied_id = json.loads(r.stdout)["id"]
        with offloadd.Client(d.target) as c:
            ok = c.wait(ok_id, timeout=240)
            denied = c.wait(denied_id, timeout=240)
    finally:
        d.stop()
    assert ok.state == S.JOB_STATE_SUCCEEDED, (ok.error, d.log()[-2000:])
    out = ws / "nobody" / "out"
    owners = {p.relative_to(out).as_posix(): p.lstat().st_uid for p in [out, *out.rglob("*")]}
    assert "model.safetensors" in owners and any(k.startswith("checkpoint-") for k in owners), owners
    assert {k: u for k, u in owners.items() if u != NOBODY} == {}, owners
    assert denied.state == S.JOB_STATE_FAILED, (S.JobState.Name(denied.state), d.log()[-2000:])
    assert str(ws / "out-root") in denied.error.message and "Permission denied" in denied.error.message, denied.error
    assert not (ws / "out-root").exists()
