"""A job's metrics history through the real daemon (CPU, fp32, a tiny Llama with held-out
evaluation): ListJobMetrics returns every step, equal to the job's progress events (training
values of every step, and the structured eval loss of each evaluation's progress event); its
pages, and ListJobEvents' pages, cover every row and event exactly once; `offloadctl metrics -o
csv|json` parse back to the same rows; trainer_state.json in the output directory carries the
same log_history; the history survives a daemon restart; calls without a valid token are refused
as every other RPC is."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import pathlib
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from test_training_jobs import Events, assets, logs, progress, spec  # noqa: E402,F401

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2
FIELDS = ("loss", "learning_rate", "grad_norm", "tokens_per_second", "aux_loss", "eval_loss")


def is_eval(p) -> bool:
    """A progress event of an evaluation (JobProgress.eval_step equal to its step)."""
    return p.HasField("eval_step") and p.eval_step == p.step


def as_dicts(rows) -> list[dict]:
    return [{"step": r.step, "epoch": r.epoch, **{f: getattr(r, f) for f in FIELDS if r.HasField(f)}}
            for r in rows]


def offloadctl(binary_dir, target, *args) -> str:
    r = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", target, *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


# One daemon and one job for the module's tests (the last one restarts the daemon).
@pytest.fixture(scope="module")
def workspace(tmp_path_factory, assets):
    root = tmp_path_factory.mktemp("metrics")
    model, data = assets
    shutil.copytree(model, root / "model")
    shutil.copy(data, root / "data.jsonl")
    return root


@pytest.fixture(scope="module")
def daemon(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    yield d
    d.stop()


@pytest.fixture(scope="module")
def finished(daemon, workspace):
    s = spec(workspace, "m", steps=8, save_steps=100)
    s["training"]["eval_steps"] = 4
    s["dataset"]["eval_split"] = 0.125
    seen = []
    with offloadd.Client(daemon.target) as c:
        done = c.submit(s, wait=True, timeout=120, on_event=seen.append)
    assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen))
    return done, seen


def test_metrics_equal_the_progress_events(daemon, finished):
    done, seen = finished
    with offloadd.Client(daemon.target) as c:
        page = c.list_metrics(done.id)
    assert not page.has_more and not page.capped
    rows = {r.step: r for r in page.metrics}
    assert sorted(rows) == list(range(0, 9))  # step 0: the evaluation before training
    train = [p for p in progress(seen) if not is_eval(p)]
    assert [p.step for p in train] == list(range(1, 9))
    for p in train:
        r = rows[p.step]
        assert (r.loss, r.learning_rate, r.grad_norm, r.tokens_per_second, r.epoch) == \
            (p.loss, p.learning_rate, p.grad_norm, p.tokens_per_second, p.epoch), p.step
        assert not r.HasField("aux_loss")  # a dense model reports none
    evals = {p.step: p.eval_loss for p in progress(seen) if is_eval(p)}
    assert sorted(evals) == [0, 4, 8]
    assert {s: r.eval_loss for s, r in rows.items() if r.HasField("eval_loss")} == evals
    assert not rows[0].HasField("loss")
    # The log line says the same, to its 6 significant digits.
    for m in logs(seen):
        if m.startswith("eval at step "):
            step, loss = int(m.split()[3].rstrip(":")), float(m.split()[5])
            assert evals[step] == pytest.approx(loss, rel=1e-5)
    # A progress event after an evaluation carries it until the next one.
    assert all(p.eval_step == 4 for p in train if 5 <= p.step <= 8)


def test_pages_cover_every_row_and_event_exactly_once(daemon, finished):
    done, seen = finished
    with offloadd.Client(daemon.target) as c:
        everything = as_dicts(c.list_metrics(done.id).metrics)
        for limit in (1, 2, 4):
            got, after = [], None
            while True:
                page = c.list_metrics(done.id, after_step=after, limit=limit)
                assert len(page.metrics) <= limit
                got += as_dicts(page.metrics)
                if not page.has_more:
                    break
                after = page.metrics[-1].step
            assert got == everything, limit
        assert as_dicts(c.iter_metrics(done.id, page_size=3)) == everything
        assert as_dicts(c.iter_metrics(done.id, after_step=4)) == everything[5:]
        cursors = [e.cursor for e in c.watch_job(done.id)]
        for limit in (1, 7):
            got, after = [], 0
            while True:
                page = c.list_events(done.id, limit=limit, after=after)
                got += [e.cursor for e in page.events]
                after = page.next_after
                if not page.has_more:
                    break
            assert got == cursors, limit
        no_progress = c.list_events(done.id, limit=1000, include_progress=False).events
        assert no_progress and not any(e.HasField("progress") for e in no_progress)
        with pytest.raises(offloadd.NotFound):
            c.list_metrics("job-does-not-exist")
        with pytest.raises(offloadd.InvalidArgument, match="limit must not be negative"):
            c.list_events(done.id, limit=-1)

    async def with_aio():
        async with offloadd.AsyncClient(daemon.target) as a:
            rows = [r async for r in a.iter_metrics(done.id, page_size=2)]
            events = await a.list_events(done.id, limit=5)
            return as_dicts(rows), [e.cursor for e in events.events]

    rows, first = asyncio.run(with_aio())
    assert rows == everything
    assert first == cursors[:5]


def test_offloadctl_metrics_csv_and_json_read_back_the_same(binary_dir, daemon, finished):
    done, _ = finished
    with offloadd.Client(daemon.target) as c:
        want = as_dicts(c.list_metrics(done.id).metrics)
    text = offloadctl(binary_dir, daemon.target, "metrics", done.id, "-o", "csv")
    got = []
    for rec in csv.DictReader(io.StringIO(text)):
        got.append({"step": int(rec["step"]), "epoch": float(rec["epoch"]),
                    **{f: float(rec[f]) for f in FIELDS if rec[f] != ""}})
    assert got == want  # %.17g reads back to the same double
    doc = json.loads(offloadctl(binary_dir, daemon.target, "metrics", done.id, "-o", "json"))
    got = [{"step": m["step"], "epoch": m.get("epoch", 0.0), **{f: m[f] for f in FIELDS if f in m}}
           for m in doc["metrics"]]
    assert got == want
    tail = offloadctl(binary_dir, daemon.target, "metrics", done.id, "--after-step", "6", "-o", "csv")
    assert [int(r["step"]) for r in csv.DictReader(io.StringIO(tail))] == [7, 8]
    table = offloadctl(binary_dir, daemon.target, "metrics", done.id)
    assert table.splitlines()[0].split() == ["STEP", "EPOCH", "LOSS", "LR", "GRAD_NORM", "TOK/S", "EVAL_LOSS"]
    r = subprocess.run([str(binary_dir / "client" / "offloadctl"), "--target", daemon.target, "list", "-o", "csv"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "only `offloadctl metrics` prints CSV" in r.stderr


def test_trainer_state_json_carries_the_whole_log_history(daemon, finished, workspace):
    done, _ = finished
    with offloadd.Client(daemon.target) as c:
        rows = c.list_metrics(done.id).metrics
    want = []
    for r in rows:
        if r.HasField("loss"):
            want.append({"epoch": r.epoch, "grad_norm": r.grad_norm, "learning_rate": r.learning_rate,
                         "loss": r.loss, "step": r.step})
        if r.HasField("eval_loss"):
            want.append({"epoch": r.epoch, "eval_loss": r.eval_loss, "step": r.step})
    state = json.loads((workspace / "m" / "trainer_state.json").read_text())
    assert state["log_history"] == want
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == [0, 4, 8]
    assert state["global_step"] == state["max_steps"] == 8
    assert all(math.isfinite(e.get("loss", 0)) for e in state["log_history"])
    transformers = pytest.importorskip("transformers")
    loaded = transformers.TrainerState.load_from_json(str(workspace / "m" / "trainer_state.json"))
    assert loaded.log_history == want and loaded.global_step == 8


def test_a_paused_and_resumed_job_keeps_one_history(daemon, workspace):
    """Each step once, in one history; trainer_state.json holds the steps before the pause too,
    and the evaluation at the step the job resumed from."""
    s = spec(workspace, "resumed", steps=40, save_steps=100000, lr=1e-4)
    s["training"]["eval_steps"] = 20
    s["dataset"]["eval_split"] = 0.125
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(s)
        ev = Events(c, job.id)
        ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 3)
        c.pause_job(job.id)
        ev.wait_for(lambda e: e.HasField("state_change") and e.state_change.state in
                    (S.JOB_STATE_PAUSED, S.JOB_STATE_SUCCEEDED))
        if c.get_job(job.id).state == S.JOB_STATE_SUCCEEDED:
            pytest.skip("the job ended before the pause took effect")
        at = c.list_checkpoints(job.id)[0].step
        c.resume_job(job.id)
        assert c.wait(job.id, timeout=180).state == S.JOB_STATE_SUCCEEDED
        ev.join()
        rows = list(c.iter_metrics(job.id))
    assert [r.step for r in rows] == list(range(0, 41))
    train = {p.step: p.loss for p in progress(ev.events) if not is_eval(p)}
    assert {r.step: r.loss for r in rows if r.HasField("loss")} == train
    evals = {r.step for r in rows if r.HasField("eval_loss")}
    assert evals == {0, at, 20, 40}
    assert {p.step for p in progress(ev.events) if is_eval(p)} == evals
    state = json.loads((workspace / "resumed" / "trainer_state.json").read_text())
    assert [e["step"] for e in state["log_history"] if "loss" in e] == list(range(1, 41))
    assert [e["loss"] for e in state["log_history"] if "loss" in e] == [r.loss for r in rows[1:]]
    assert [e["step"] for e in state["log_history"] if "eval_loss" in e] == sorted(evals)


def test_the_history_survives_a_daemon_restart(daemon, finished):
    done, _ = finished
    with offloadd.Client(daemon.target) as c:
        before = as_dicts(c.list_metrics(done.id).metrics)
    daemon.stop()
    daemon.start()
    with offloadd.Client(daemon.target) as c:
        assert as_dicts(c.list_metrics(done.id).metrics) == before


def test_without_a_valid_token_the_history_is_refused(binary_dir, tmp_path):
    from test_tcp_tls import start_tls_daemon

    d, target, cert, _ = start_tls_daemon(binary_dir, tmp_path, "s3cret-token-for-tests-0123456789\n")
    try:
        bad = tmp_path / "bad_token"
        bad.write_text("not-the-right-token-at-all\n")
        with offloadd.Client(target, tls_ca_file=str(cert), token_file=str(bad), tls_server_name="localhost") as c:
            for call in (lambda: c.list_metrics("job-x"), lambda: c.list_events("job-x")):
                with pytest.raises(offloadd.Unauthenticated, match="invalid bearer token"):
                    call()
    finally:
        d.stop()
