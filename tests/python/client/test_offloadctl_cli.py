"""offloadctl's command line against the fake JobService: per-command
help, flags after the command and --flag=value, -o json|yaml, watch -o json as JSON Lines, the
exit codes (failed, cancelled, not found, unreachable, usage, invalid job file), --version, the
bash completion script and `submit -`."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import yaml

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from fake_job_service import FakeJobService, FakeServer, scripted_events  # noqa: E402

from offloadd.v1 import job_pb2  # noqa: E402

COMMANDS = {
    "health": [], "node": [], "submit": ["--validate-only", "--watch"], "list": ["--state"],
    "get": ["--wait"], "describe": ["--events"], "logs": ["--follow"], "delete": ["--purge"],
    "cancel": ["--force"], "pause": [], "resume": [], "checkpoints": [], "watch": [],
    "metrics": ["--after-step"],
    "completion": [], "convert": ["--from", "--model", "--dataset", "--output-dir", "--out", "--validate"],
}


@pytest.fixture()
def ctl(binary_dir):
    path = binary_dir / "client" / "offloadctl"
    if not path.exists():
        pytest.skip(f"{path} is not built")

    def run(*args, stdin=None):
        return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60, input=stdin)

    return run


@pytest.fixture()
def fake(tmp_path):
    servers = []

    def start(service=None):
        servers.append(FakeServer(service or FakeJobService(scripted_events(), known_jobs={"job-1"}), tmp_path))
        return servers[-1]

    yield start
    for s in servers:
        s.stop()


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_each_command_has_help_naming_its_flags(ctl, command):
    r = ctl(command, "--help")
    assert r.returncode == 0, r.stderr
    assert command in r.stdout and "--help" in r.stdout
    for flag in COMMANDS[command]:
        assert flag in r.stdout, r.stdout


def test_top_level_help_lists_commands_and_exit_codes(ctl):
    r = ctl("--help")
    assert r.returncode == 0
    for word in list(COMMANDS) + ["--target", "--output", "--json", "Exit status", "4  job or checkpoint not found"]:
        assert word in r.stdout, word


def test_submit_help_is_help_not_a_file(ctl):
    r = ctl("submit", "--help")
    assert r.returncode == 0 and "does not exist" not in r.stderr and "FILE" in r.stdout


def test_version(ctl, source_dir):
    r = ctl("--version")
    assert r.returncode == 0
    import re
    version = re.search(r"project\(offloadd VERSION (\S+)", (source_dir / "CMakeLists.txt").read_text()).group(1)
    assert r.stdout.strip() == f"offloadctl (offloadd) {version}"


@pytest.mark.parametrize("args", [
    lambda t: ["--target", t, "get", "job-1"],
    lambda t: [f"--target={t}", "get", "job-1"],
    lambda t: ["get", "job-1", "--target", t],
    lambda t: ["get", f"--target={t}", "job-1", "--timeout=5"],
])
def test_global_flags_in_any_position(ctl, fake, args):
    server = fake()
    r = ctl(*args(server.target))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("job job-1")


def test_output_json_and_yaml_parse_back(ctl, fake):
    server = fake()
    for cmd in (["get", "job-1"], ["list"], ["list", "--state", "succeeded"]):
        j = ctl("--target", server.target, *cmd, "-o", "json")
        assert j.returncode == 0, j.stderr
        y = ctl(*cmd, "--target", server.target, "--output=yaml")
        assert y.returncode == 0, y.stderr
        assert json.loads(j.stdout) == yaml.safe_load(y.stdout)
    assert json.loads(ctl("--target", server.target, "--json", "get", "job-1").stdout)["id"] == "job-1"
    assert yaml.safe_load(ctl("--target", server.target, "-o", "yaml", "get", "job-1").stdout)["state"] == \
        "succeeded"


# A display name that clears the screen, sets the window title, rings the bell, and (CSI as the C1
# byte, a right-to-left override) hides what follows; then a line break that would forge a row.
HOSTILE_NAME = "x\x1b[2J\x1b]0;owned\x07\u009b31m\u202eevil\nfake-row SUCCEEDED"


def test_table_output_escapes_control_characters(ctl, fake):
    """Issue #29 item 13: list and get show a job's display name, labels and errors escaped; JSON and
    YAML give the exact bytes back."""
    job = job_pb2.Job(spec=job_pb2.JobSpec(display_name=HOSTILE_NAME), submitted_by="uid:0\x1b[8m")
    job.error.code = 3
    job.error.message = "bad\x1b[31m\nsecond line"
    server = fake(FakeJobService(scripted_events(), known_jobs={"job-1"}, job=job,
                                 jobs=[job_pb2.Job(id="job-1", spec=job.spec)]))
    for cmd in (["list"], ["get", "job-1"]):
        r = ctl("--target", server.target, *cmd)
        assert r.returncode == 0, r.stderr
        for raw in ("\x1b", "\x07", "\u009b", "\u202e"):
            assert raw not in r.stdout, (cmd, r.stdout)
        assert "x\\x1b[2J\\x1b]0;owned\\x07\\u009b31m\\u202eevil\\nfake-row SUCCEEDED" in r.stdout, r.stdout
        assert "\nfake-row" not in r.stdout, r.stdout
    get = ctl("--target", server.target, "get", "job-1").stdout
    assert "submitted by uid:0\\x1b[8m" in get and "error: bad\\x1b[31m\nsecond line" in get, get
    listed = json.loads(ctl("--target", server.target, "list", "-o", "json").stdout)
    assert listed["jobs"][0]["spec"]["display_name"] == HOSTILE_NAME
    got = yaml.safe_load(ctl("--target", server.target, "get", "job-1", "-o", "yaml").stdout)
    assert got["spec"]["display_name"] == HOSTILE_NAME


def test_watch_json_is_json_lines(ctl, fake):
    server = fake()
    r = ctl("watch", "job-1", "-o", "json", "--target", server.target)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert [e["cursor"] for e in events] == [1, 2, 3, 4, 5]  # numbers, not strings
    assert events[-1]["state_change"]["state"] == "succeeded"
    r = ctl("watch", "job-1", "-o", "yaml", "--target", server.target)
    assert len([d for d in yaml.safe_load_all(r.stdout) if d]) == 5


def _ending(state, reason):
    events = scripted_events()
    events[-1].state_change.state = state
    events[-1].state_change.reason = reason
    return FakeJobService(events, final_state=state, known_jobs={"job-1"})


def test_exit_1_when_the_job_failed(ctl, fake):
    server = fake(_ending(job_pb2.JOB_STATE_FAILED, "CUDA out of memory"))
    r = ctl("--target", server.target, "watch", "job-1")
    assert r.returncode == 1 and "job job-1 ended failed" in r.stderr, r.stderr
    assert "[5] state failed CUDA out of memory" in r.stdout
    assert ctl("--target", server.target, "get", "job-1", "--wait").returncode == 1
    assert ctl("--target", server.target, "get", "job-1").returncode == 0  # no waiting: just shown


def test_exit_3_when_the_job_was_cancelled(ctl, fake):
    server = fake(_ending(job_pb2.JOB_STATE_CANCELLED, "by user"))
    r = ctl("--target", server.target, "watch", "job-1")
    assert r.returncode == 3 and "ended cancelled" in r.stderr, r.stderr
    assert ctl("--target", server.target, "get", "--wait", "job-1").returncode == 3


def test_exit_4_when_the_job_does_not_exist(ctl, fake):
    server = fake()
    for cmd in (["get", "job-404"], ["watch", "job-404"], ["cancel", "job-404"]):
        r = ctl("--target", server.target, *cmd)
        assert r.returncode == 4 and "NOT_FOUND" in r.stderr and "job-404" in r.stderr, (cmd, r.stderr)


def test_exit_5_when_the_daemon_is_unreachable(ctl, tmp_path):
    target = f"unix://{tmp_path}/no-such.sock"
    for cmd in (["health"], ["get", "job-1"], ["list"]):
        r = ctl("--target", target, "--timeout", "5", *cmd)
        assert r.returncode == 5, (cmd, r.returncode, r.stderr)
        assert "UNAVAILABLE" in r.stderr or "DEADLINE" in r.stderr, r.stderr


@pytest.mark.parametrize("args,says", [
    ([], "no command given"),
    (["frobnicate"], "frobnicate"),
    (["get"], "JOB"),
    (["list", "--bogus"], "--bogus"),
    (["-o", "xml", "list"], "xml"),
    (["list", "--state", "sleeping"], "sleeping"),
    (["--timeout=0", "health"], "timeout"),
    (["submit", "missing.yaml"], "the job file 'missing.yaml' does not exist"),
])
def test_exit_2_on_usage_errors(ctl, tmp_path, args, says):
    r = ctl("--target", f"unix://{tmp_path}/no-such.sock", *args)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert says in r.stderr and r.stderr.startswith("offloadctl: "), r.stderr


def test_exit_6_on_an_invalid_job_file(ctl, fake, tmp_path):
    server = fake()
    bad = tmp_path / "bad.yaml"
    bad.write_text("display_name: x\ntraining: {learning_rat: 1}\n")
    r = ctl("--target", server.target, "submit", str(bad))
    assert r.returncode == 6 and "learning_rat" in r.stderr, r.stderr


def test_cancel_with_a_reason_after_flags(ctl, fake):
    server = fake()
    r = ctl("cancel", "-o", "json", "job-1", "not needed", "--target", server.target)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["state"] == "cancelled"
    assert server.service.cancelled == [("job-1", "not needed")]
    assert server.service.forced == []


def test_cancel_force_asks_the_daemon_to_kill_at_once(ctl, fake):
    server = fake()
    r = ctl("cancel", "job-1", "--force", "--target", server.target)
    assert r.returncode == 0, r.stderr
    assert server.service.forced == ["job-1"]


def test_submit_reads_the_job_file_from_stdin(ctl, fake):
    server = fake()
    r = ctl("--target", server.target, "submit", "-", "-o", "json", stdin="display_name: from-stdin\n")
    assert r.returncode == 0, r.stderr
    job = json.loads(r.stdout)
    assert job["id"] == "job-1" and job["spec"]["display_name"] == "from-stdin"
    r = ctl("--target", server.target, "submit", "-", "--watch", "-o", "json", stdin="display_name: w\n")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert lines[0]["id"] == "job-1" and int(lines[-1]["cursor"]) == 5
    r = ctl("--target", server.target, "submit", "-", stdin="")
    assert r.returncode == 2 and "stdin" in r.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_bash_completion_script(ctl, tmp_path):
    r = ctl("completion", "bash")
    assert r.returncode == 0, r.stderr
    script = tmp_path / "offloadctl.bash"
    script.write_text(r.stdout)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    # Drive the function as bash's completion would.
    def complete(*words):
        line = " ".join(["offloadctl", *words])
        prog = (f"source {script}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
                "_offloadctl; printf '%s\\n' \"${COMPREPLY[@]}\"")
        return subprocess.run(["bash", "-c", prog], capture_output=True, text=True).stdout.split()
    assert "submit" in complete("su") and "--target" in complete("--ta")
    assert complete("-o", "'j'") == ["json"] or complete("-o", "j") == ["json"]
    assert "--validate-only" in complete("submit", "--va")
    assert complete("list", "--state", "runn") == ["running"]
    assert complete("completion", "z") == ["zsh"]
    zsh = ctl("completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef offloadctl")


def test_convert_refuses_what_is_not_a_small_regular_file(ctl, tmp_path):
    """Issue #29 item 18: /dev/zero and a 100 MB JSON aborted convert with bad_alloc, and a FIFO
    hung it. Each is refused at once, naming the file."""
    fifo = tmp_path / "args.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(100 << 20)  # sparse: its size is what is refused
    for path, why in (("/dev/zero", "is a character device"), (str(fifo), "is a FIFO"),
                      (str(big), "is 100 MiB, more than the 1 MiB a configuration may be")):
        r = ctl("convert", path)  # the fixture's timeout (60 s) catches a hang
        assert r.returncode == 2, (path, r.returncode, r.stderr)
        assert why in r.stderr, (path, r.stderr)
    # The job file of submit is read the same way.
    r = ctl("submit", str(fifo), "--target", "unix:///nonexistent.sock")
    assert r.returncode == 2 and "is a FIFO" in r.stderr, r.stderr


def test_convert_out_never_follows_a_symlink(ctl, tmp_path):
    """Issue #29 item 18: --out onto a dangling symlink wrote through it, outside the directory."""
    args = tmp_path / "args.json"
    args.write_text('{"learning_rate": 1e-4}')
    outside = tmp_path / "outside"
    outside.mkdir()
    link = tmp_path / "job.yaml"
    link.symlink_to(outside / "planted.yaml")  # dangling
    r = ctl("convert", str(args), "--out", str(link))
    assert r.returncode == 2, r.stderr
    assert "exists (a symbolic link, which is not followed); it is not overwritten" in r.stderr, r.stderr
    assert not (outside / "planted.yaml").exists()
    fresh = tmp_path / "fresh.yaml"
    r = ctl("convert", str(args), "--out", str(fresh))
    assert r.returncode == 0, r.stderr
    assert "learning_rate: 1e-4" in fresh.read_text()


@pytest.mark.parametrize("args, key", [('{"learning_rate": "fast"}', "learning_rate"),
                                       ('{"learning_rate": NaN}', "learning_rate"),
                                       ('{"max_steps": -5}', "max_steps")])
def test_convert_refuses_values_the_daemon_would_refuse(ctl, tmp_path, args, key):
    """Issue #29 item 18: invalid values were copied into the job file with exit 0."""
    path = tmp_path / "args.json"
    path.write_text(args)
    out = tmp_path / "job.yaml"
    r = ctl("convert", str(path), "--out", str(out))
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert f"{path} `{key}` (training.{key}): " in r.stderr, r.stderr
    assert not out.exists()


def _described_service(**kwargs):
    """job-1 with an output directory, a log line of setup, a warning, a checkpoint and a failure."""
    events = scripted_events()
    setup = job_pb2.JobEvent(cursor=2, job_id="job-1")
    setup.log.level = job_pb2.LOG_LEVEL_INFO
    setup.log.message = "batch size (auto): 4 x 2"
    warning = job_pb2.JobEvent(cursor=3, job_id="job-1")
    warning.log.level = job_pb2.LOG_LEVEL_WARNING
    warning.log.message = "grad norm is not finite at step 2"
    saved = job_pb2.JobEvent(cursor=4, job_id="job-1")
    saved.checkpoint_saved.id = "checkpoint-2"
    saved.checkpoint_saved.step = 2
    for e in (setup, warning, saved):
        e.time.seconds = 1000 + e.cursor
    events = [events[0], setup, warning, saved, events[4]]
    job = job_pb2.Job(spec=job_pb2.JobSpec(display_name="demo", output_dir="/srv/out/demo"))
    job.spec.model.path = "/models/tiny"
    ckpt = job_pb2.Checkpoint(id="checkpoint-2", job_id="job-1", step=2, path="/srv/out/demo/checkpoint-2",
                              size_bytes=3 << 20, loss=1.25)
    ckpt.create_time.seconds = 1700000000
    return FakeJobService(events, known_jobs={"job-1"}, job=job, checkpoints=[ckpt], **kwargs)


def test_checkpoints_prints_a_table(ctl, fake):
    server = fake(_described_service())
    r = ctl("checkpoints", "job-1", "--target", server.target)
    assert r.returncode == 0, r.stderr
    header, row = r.stdout.splitlines()[:2]
    assert header.split() == ["STEP", "LOSS", "SIZE", "CREATED", "PATH"], r.stdout
    assert row.split()[:2] == ["2", "1.2500"] and row.endswith("/srv/out/demo/checkpoint-2"), r.stdout
    assert not r.stdout.lstrip().startswith("{"), r.stdout
    listed = json.loads(ctl("checkpoints", "job-1", "-o", "json", "--target", server.target).stdout)
    assert listed["checkpoints"][0]["step"] == 2 and listed["checkpoints"][0]["size_bytes"] == 3 << 20


def test_get_shows_the_output_directory(ctl, fake):
    server = fake(_described_service())
    r = ctl("get", "job-1", "--target", server.target)
    assert r.returncode == 0, r.stderr
    assert "output /srv/out/demo" in r.stdout, r.stdout


def test_describe_shows_spec_setup_events_checkpoints_and_output(ctl, fake):
    server = fake(_described_service())
    r = ctl("describe", "job-1", "--target", server.target)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    for section in ("Transitions:", "Placement:", "Setup and plan (latest run):", "Spec:", "Events (last 20):",
                    "Checkpoints:", "Output directory: /srv/out/demo"):
        assert section in out, (section, out)
    setup = out.split("Setup and plan (latest run):")[1].split("Spec:")[0]
    assert "batch size (auto): 4 x 2" in setup, out
    assert '"path": "/models/tiny"' in out.split("Spec:")[1], out
    events = out.split("Events (last 20):")[1].split("Checkpoints:")[0]
    assert "grad norm is not finite" in events and "checkpoint checkpoint-2 at step 2" in events, out
    assert "/srv/out/demo/checkpoint-2" in out.split("Checkpoints:")[1], out
    # Progress is not asked for: describe shows what happened, not every step.
    assert server.service.watch_requests[-1].include_progress is False
    assert server.service.watch_requests[-1].until_now is True
    d = json.loads(ctl("describe", "job-1", "-o", "json", "--events", "2", "--target", server.target).stdout)
    assert d["job"]["state"] == "succeeded" and d["output_dir"] == "/srv/out/demo"
    assert [e["cursor"] for e in d["events"]] == [4, 5]
    assert d["checkpoints"][0]["path"] == "/srv/out/demo/checkpoint-2"
    assert yaml.safe_load(ctl("describe", "job-1", "-o", "yaml", "--target", server.target).stdout)["job"]["id"] == \
        "job-1"
    missing = ctl("describe", "job-9", "--target", server.target)
    assert missing.returncode == 4 and missing.stderr.count("job-9") == 1, missing.stderr


def test_logs_prints_the_jobs_log_lines(ctl, fake):
    server = fake(_described_service(hang_at_end=True))
    r = ctl("logs", "job-1", "--target", server.target)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 2, r.stdout
    assert lines[0].split()[3:] == ["info", "batch", "size", "(auto):", "4", "x", "2"], lines
    assert "warning" in lines[1] and lines[1].endswith("grad norm is not finite at step 2"), lines
    j = [json.loads(line) for line in ctl("logs", "job-1", "-o", "json", "--target", server.target).stdout.splitlines()]
    assert [e["log"]["level"] for e in j] == ["info", "warning"]


def test_logs_follow_prints_until_the_job_ends(ctl, fake):
    server = fake(_described_service())
    r = ctl("logs", "-f", "job-1", "--target", server.target)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 2, r.stdout
    assert not server.service.watch_requests[-1].until_now


def test_each_refusal_is_reported_once(ctl, fake, tmp_path):
    """The daemon's message inlines the first problems and its details list them all: a missing
    model was printed twice. Now once each, by offloadctl and by the Python SDK."""
    problems = [("model.path", "/models/gone does not exist"), ("training.learning_rate", "must be > 0")]
    server = fake(FakeJobService([], create_violations=problems))
    job = tmp_path / "job.yaml"
    job.write_text("display_name: x\n")
    r = ctl("--target", server.target, "submit", str(job))
    assert r.returncode == 6, r.stderr
    for _, description in problems:
        assert r.stderr.count(description) == 1, r.stderr
    assert "2 problems in the job spec:" in r.stderr, r.stderr
    import offloadd
    with offloadd.Client(server.target) as c, pytest.raises(offloadd.InvalidArgument) as err:
        c.create_job({"display_name": "x"})
    for _, description in problems:
        assert str(err.value).count(description) == 1, str(err.value)


def test_delete_removes_the_record_and_with_purge_the_output_directory(ctl, fake, tmp_path):
    out = tmp_path / "out"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "model.safetensors").write_bytes(b"x")
    job = job_pb2.Job(spec=job_pb2.JobSpec(output_dir=str(out)))
    server = fake(FakeJobService([], known_jobs={"job-1"}, job=job))
    r = ctl("delete", "job-1", "--target", server.target)
    assert r.returncode == 0, r.stderr
    assert server.service.deleted == ["job-1"] and out.is_dir(), "a plain delete keeps the output"
    r = ctl("delete", "job-1", "--purge", "--target", server.target)
    assert r.returncode == 0, r.stderr
    assert not out.exists() and f"and its output directory {out}" in r.stdout, r.stdout
    missing = ctl("delete", "job-9", "--target", server.target)
    assert missing.returncode == 4, missing.stderr
    import offloadd
    with offloadd.Client(server.target) as c:  # the SDK's delete_job is the same call
        assert c.delete_job("job-1").id == "job-1"
    assert server.service.deleted == ["job-1"] * 3


def test_delete_purge_refuses_a_running_job(ctl, fake, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    job = job_pb2.Job(spec=job_pb2.JobSpec(output_dir=str(out)))
    server = fake(FakeJobService([], known_jobs={"job-1"}, job=job, final_state=job_pb2.JOB_STATE_RUNNING))
    r = ctl("delete", "job-1", "--purge", "--target", server.target)
    assert r.returncode == 7 and "running" in r.stderr and "cancel it first" in r.stderr, r.stderr
    assert out.is_dir() and server.service.deleted == []
    r = ctl("delete", "job-1", "--target", server.target)  # the daemon refuses it too
    assert r.returncode == 7 and "FAILED_PRECONDITION" in r.stderr, r.stderr
