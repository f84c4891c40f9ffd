"""Training jobs through the real daemon (CPU, fp32): a job trains to SUCCEEDED and leaves a model
transformers loads; after kill -9 of the daemon the job resumes from its last checkpoint by itself
and its loss curve equals an uninterrupted run's; pause writes a checkpoint that resume continues
from; cancel ends a running job; a running job's steps show in the Prometheus metrics (and stay
for the retention after it stops); optimizer states on the NVMe tier (a per-job store directory, removed afterwards) train bit-identically."""

from __future__ import annotations

import pathlib
import shutil
import signal
import sys
import threading
import time
import urllib.request

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny Llama with its tokenizer and a pretokenized dataset, shared by the tests."""
    root = tmp_path_factory.mktemp("assets")
    model = build_model(root / "model", layers=2)
    data = write_pretokenized(root / "data.jsonl", n=64)
    return model, data


@pytest.fixture()
def workspace(tmp_path, assets):
    # The daemon reads only under its allowed roots (symlinks resolved): copy the small assets in.
    model, data = assets
    shutil.copytree(model, tmp_path / "model")
    shutil.copy(data, tmp_path / "data.jsonl")
    return tmp_path


@pytest.fixture()
def daemon(binary_dir, workspace):
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    yield d
    d.stop()


def spec(ws: pathlib.Path, out: str, *, steps: int, save_steps: int, lr: float = 3e-3, accum: int = 1) -> dict:
    return {
        "display_name": out,
        "model": {"path": str(ws / "model"), "compute_dtype": "fp32"},
        "dataset": {"paths": [str(ws / "data.jsonl")], "format": "pretokenized", "max_seq_length": 64},
        "training": {"learning_rate": lr, "per_device_train_batch_size": 4, "max_steps": steps,
                     "gradient_accumulation_steps": accum,
                     "warmup_steps": 2, "lr_scheduler_type": "cosine", "weight_decay": 0.1,
                     "max_grad_norm": 0.5, "seed": 7, "logging_steps": 1, "save_steps": save_steps},
        "output_dir": str(ws / out),
    }


class Events:
    """Collects a job's events from a WatchJob stream on a thread (it survives a daemon crash: the
    stream just ends)."""

    def __init__(self, client: offloadd.Client, job_id: str, after_cursor: int = 0):
        self.events: list = []
        self.cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(client, job_id, after_cursor), daemon=True)
        self._thread.start()

    def _run(self, client, job_id, after_cursor):
        try:
            for e in client.watch_job(job_id, after_cursor=after_cursor):
                with self.cond:
                    self.events.append(e)
                    self.cond.notify_all()
        except offloadd.OffloaddError:
            pass  # the daemon went away

    def join(self, timeout: float = 30) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the watch stream did not end"

    def wait_for(self, pred, timeout: float = 60):
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                left = deadline - time.monotonic()
                assert left > 0, f"no matching event in {timeout}s; last events: {self.events[-5:]}"
                self.cond.wait(left)


def scrape(d: DaemonProcess) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as r:
        return r.read().decode()


def progress(events) -> list:
    return [e.progress for e in events if e.HasField("progress")]


def logs(events) -> list[str]:
    return [e.log.message for e in events if e.HasField("log")]


def losses_by_step(events) -> dict[int, float]:
    return {p.step: p.loss for p in progress(events)}  # a re-run step keeps its latest report


def test_job_trains_to_a_loadable_model(daemon, workspace):
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec(workspace, "out", steps=12, save_steps=4))
        assert job.state == S.JOB_STATE_QUEUED
        seen = []
        done = c.wait(job.id, timeout=120, on_event=seen.append)
        assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen), daemon.log()[-3000:])
        prog = progress(seen)
        assert [p.step for p in prog] == list(range(1, 13))
        assert all(p.max_steps == 12 and p.loss > 0 and p.tokens_per_second > 0 for p in prog)
        assert prog[-1].tokens_seen > prog[0].tokens_seen > 0
        losses = [p.loss for p in prog]
        assert sum(losses[-3:]) < sum(losses[:3]), losses  # it learns
        assert done.progress.step == 12
        checkpoints = c.list_checkpoints(job.id)
        assert [k.step for k in checkpoints] == [4, 8]
        assert all(k.id == f"checkpoint-{k.step}" and k.size_bytes > 0 and k.job_id == job.id for k in checkpoints)
        assert done.latest_checkpoint_step == 8
        # The job's log names the CPU AdamW kernel it ran and why (workers.adamw_kernel / the
        # daemon's OFFLOADD_ADAMW_KERNEL / the fastest the CPU supports).
        plan = [m for m in logs(seen) if m.startswith("plan: ")]
        assert len(plan) == 1 and ", AdamW kernel " in plan[0], logs(seen)
    out = workspace / "out"
    # The trace is beside the model (output_dir/runs/), not among its files; the model card is.
    assert (out / "runs" / "trace.json").stat().st_size > 0 and not (out / "trace.json").exists()
    assert (out / "README.md").read_text().startswith("---\nlibrary_name: transformers\n")
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    ids = torch.tensor([[1, 2, 3, 4]])
    assert torch.isfinite(model(input_ids=ids).logits).all()


def test_kill_9_resumes_from_the_last_checkpoint_with_the_same_losses(binary_dir, workspace):
    # Four micro-batches per step make the steps slow enough (tens of ms) for the kill to land
    # well before the last one, and put the data cursor mid-epoch at the checkpoints before the
    # kill. Killed at step 12 of 60: of 30, the 18 steps to spare were a window a loaded machine's
    # event delivery could miss (the job ended first, failing `killed_at < steps`).
    steps, save, accum = 60, 5, 4
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    try:
        with offloadd.Client(d.target) as c:
            job = c.create_job(spec(workspace, "crash", steps=steps, save_steps=save, accum=accum))
            first = Events(c, job.id)
            first.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 12)
            d.proc.send_signal(signal.SIGKILL)
            d.proc.wait()
            first.join()
        d.stop()
        killed_at = max(p.step for p in progress(first.events))
        assert killed_at < steps, "the job finished before the kill; make its steps slower"
        saved = [e.checkpoint_saved.step for e in first.events if e.HasField("checkpoint_saved")]
        assert saved and max(saved) >= 10, saved

        d.start()  # same state dir: the job is found RUNNING and queued again
        with offloadd.Client(d.target) as c:
            seen = []
            done = c.wait(job.id, timeout=120, on_event=seen.append)
            assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen), d.log()[-3000:])
            resumed = [m for m in logs(seen) if m.startswith("resuming from ")]
            assert len(resumed) == 1, logs(seen)
            resume_step = int(resumed[0].rsplit("checkpoint-", 1)[1])
            assert resume_step == max(saved) and resume_step <= killed_at
            # Every step shows once: those the first run reported before the kill are trained
            # again from the checkpoint without new progress events.
            assert [p.step for p in progress(seen)] == list(range(1, steps + 1))
            cursor_after_kill = first.events[-1].cursor
            second = [e for e in seen if e.cursor > cursor_after_kill]
            assert progress(second)[-1].step == steps and progress(second)[0].step > killed_at
            states = [S.JobState.Name(e.state_change.state) for e in seen if e.HasField("state_change")]
            assert states[-3:] == ["JOB_STATE_QUEUED", "JOB_STATE_RUNNING", "JOB_STATE_SUCCEEDED"], states

            # The same job without the crash.
            ref_events = []
            ref = c.submit(spec(workspace, "reference", steps=steps, save_steps=save, accum=accum), wait=True, timeout=120,
                           on_event=ref_events.append)
            assert ref.state == S.JOB_STATE_SUCCEEDED, ref.error
    finally:
        d.stop()
    crashed, reference = losses_by_step(seen), losses_by_step(ref_events)
    assert sorted(reference) == list(range(1, steps + 1))
    after = range(resume_step + 1, steps + 1)
    assert [crashed[s] for s in after] == [reference[s] for s in after], "resumed losses differ"
    # Steps the first run did after its checkpoint were recomputed identically by the second.
    before_kill = losses_by_step(first.events)
    assert all(before_kill[s] == reference[s] for s in range(1, killed_at + 1))


def test_pause_checkpoints_resume_continues_and_cancel_stops(daemon, workspace):
    with offloadd.Client(daemon.target) as c:
        job = c.create_job(spec(workspace, "pausable", steps=2000, save_steps=100000, lr=1e-4))
        ev = Events(c, job.id)
        ev.wait_for(lambda e: e.HasField("progress") and e.progress.step >= 3)
        series = f'offloadd_train_steps_total{{job_id="{job.id}"}}'
        assert series in scrape(daemon), "a running job's steps show in the metrics"
        assert c.pause_job(job.id).state in (S.JOB_STATE_PAUSING, S.JOB_STATE_PAUSED)
        ev.wait_for(lambda e: e.HasField("state_change") and e.state_change.state == S.JOB_STATE_PAUSED)
        paused = c.get_job(job.id)
        checkpoints = c.list_checkpoints(job.id)
        assert len(checkpoints) == 1, checkpoints
        at = checkpoints[0].step
        assert at >= 3 and paused.latest_checkpoint_step == at and paused.progress.step == at
        assert (pathlib.Path(checkpoints[0].path) / "trainer_state.json").exists()

        cursor = ev.events[-1].cursor
        assert c.resume_job(job.id).state == S.JOB_STATE_QUEUED
        after = ev.wait_for(lambda e: e.cursor > cursor and e.HasField("progress") and e.progress.step > at + 2)
        assert f"resuming from {checkpoints[0].path}" in logs(ev.events)
        assert [p.step for p in progress(e for e in ev.events if e.cursor > cursor)][0] == at + 1
        assert after.progress.step < 2000

        assert c.cancel_job(job.id).state in (S.JOB_STATE_CANCELLING, S.JOB_STATE_CANCELLED)
        done = c.wait(job.id, timeout=60)
        assert done.state == S.JOB_STATE_CANCELLED
        assert [k.step for k in c.list_checkpoints(job.id)] == [at], "cancel writes no checkpoint"
        assert done.progress.step < 2000
    # A stopped job's series stay for metrics.job_series_retention_seconds (900 s by default; their
    # removal after it is unit-tested with a fake clock), beside its info series.
    text = scrape(daemon)
    assert series in text, "a stopped job's series stay for the retention"
    assert f'offloadd_job_info{{gpus="cpu",job_id="{job.id}"}} 1' in text, text
    # /metrics is unauthenticated: nothing the user wrote is on it.
    for private in ("pausable", str(workspace), "display_name", "model="):
        assert private not in text, (private, text)


def train_variant(c, workspace, name: str, offload: dict, **kw):
    """Runs one job with these offload settings to completion; returns (job, progress, logs)."""
    s = spec(workspace, name, **kw)
    s["offload"] = offload
    seen = []
    done = c.submit(s, wait=True, timeout=120, on_event=seen.append)
    assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen))
    return done, [(p.step, p.loss, p.grad_norm) for p in progress(seen)], logs(seen)


def test_nvme_tier_job_equals_ram_tier_and_removes_its_states(daemon, workspace):
    with offloadd.Client(daemon.target) as c:
        _, ram, _ = train_variant(c, workspace, "tier-cpu", {"offload_optimizer": {"device": "cpu"}},
                                  steps=6, save_steps=3)
        done, nvme, log = train_variant(c, workspace, "tier-nvme", {"offload_optimizer": {"device": "nvme"}},
                                        steps=6, save_steps=3)
        # The job's worker and store processes reach the daemon's /metrics.
        text = scrape(daemon)
        # A tiny model's updates may take less CPU than one clock tick (10 ms): present, maybe 0.
        assert f'offloadd_worker_cpu_seconds_total{{job_id="{done.id}",worker="0"}} ' in text
        for series in (f'offloadd_worker_busy_seconds_total{{job_id="{done.id}",worker="0"}}',
                       f'offloadd_job_store_requests_total{{job_id="{done.id}",result="ok",role="optimizer"}}',
                       f'offloadd_job_store_latency_seconds_count{{job_id="{done.id}",role="optimizer"}}',
                       f'offloadd_job_host_arena_bytes{{job_id="{done.id}"}}'):
            value = next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(series + " ")), None)
            assert value is not None and value > 0, (series, text[-3000:])
    assert any("optimizer states in NVMe" in m for m in log), log
    # The store held them in <storage dir>/<job id> while the job ran; the checkpoints keep what a
    # resume needs.
    assert not (workspace / done.id).exists()
    assert nvme == ram


def test_activations_offloaded_to_nvme_train_like_kept_ones(daemon, workspace):
    with offloadd.Client(daemon.target) as c:
        _, kept, _ = train_variant(c, workspace, "acts-keep", {"activations": {"mode": "keep"}},
                                   steps=4, save_steps=4)
        done, spilled, log = train_variant(c, workspace, "acts-nvme", {"activations": {"mode": "offload_nvme"}},
                                           steps=4, save_steps=4)
    assert any("offload_nvme" in m for m in log), log
    assert not (workspace / done.id).exists(), "scratch activations are removed"
    assert spilled == kept


def test_lsp_compression_job_trains_and_checkpoints_its_subspace(daemon, workspace):
    """compression: {type: lsp} through the job API, on this GPU-less node, with
    held-out evaluation (dataset.eval_paths, training.eval_steps)."""
    s = spec(workspace, "lsp", steps=8, save_steps=4)
    s["compression"] = {"type": "lsp", "subspace_rank": 8, "sparsity": 2, "projector_update_interval": 4}
    s["dataset"]["eval_paths"] = [str(workspace / "data.jsonl")]  # evaluated at steps 0, 4 and 8
    s["training"]["eval_steps"] = 4
    with offloadd.Client(daemon.target) as c:
        resolved = c.create_job(s, validate_only=True)
        assert (resolved.spec.compression.subspace_rank, resolved.spec.compression.sparsity,
                resolved.spec.compression.projector_update_interval) == (8, 2, 4)
        job = c.create_job(s)
        seen = []
        done = c.wait(job.id, timeout=120, on_event=seen.append)
        assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen), daemon.log()[-3000:])
    log = logs(seen)
    assert any("LSP-Offload on 14 decoder-layer matrices (s=8 d=2" in m for m in log), log
    checks = [m for m in log if m.startswith("LSP projector check before step")]
    assert [m.split("before step ")[1].split(":")[0] for m in checks] == ["1", "5"], checks
    assert (workspace / "lsp" / "checkpoint-4" / "lsp_state.safetensors").stat().st_size > 0
    evals = [m for m in log if m.startswith("eval at step")]
    assert [m.split("eval at step ")[1].split(":")[0] for m in evals] == ["0", "4", "8"], evals
    # Each step's progress event, and one more of each evaluation (its eval_step is its step).
    def evaluation(p):
        return p.HasField("eval_step") and p.eval_step == p.step

    assert [p.step for p in progress(seen) if evaluation(p)] == [0, 4, 8]
    assert [p.step for p in progress(seen) if not evaluation(p)] == list(range(1, 9))


def test_progress_is_reported_every_interval_whatever_logging_steps(binary_dir, workspace):
    """metrics.progress_interval_seconds: with logging_steps far above the job's
    steps, progress events still come at least every interval, not only at the end."""
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace)
    d.config_path.write_text(d.config_path.read_text().replace(
        "  listen: 127.0.0.1:0\n", "  listen: 127.0.0.1:0\n  progress_interval_seconds: 0.1\n"))
    d.start()
    try:
        with offloadd.Client(d.target) as c:
            s = spec(workspace, "out", steps=60, save_steps=1000)
            s["training"]["logging_steps"] = 1000
            seen = []
            t0 = time.monotonic()
            done = c.wait(c.create_job(s).id, timeout=120, on_event=seen.append)
            took = time.monotonic() - t0
            assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen))
            steps = [p.step for p in progress(seen)]
            assert steps[-1] == 60 and steps == sorted(steps), steps
            # Training took `took` seconds; an event at least every 0.1 s of it (minus setup) means
            # more than the final one whenever the steps themselves took over 0.1 s.
            assert len(steps) >= 2, (steps, took)
    finally:
        d.stop()
