"""Through the real daemon: after a crash, a newest checkpoint whose tensor bytes
were flipped is detected (crc32c) and skipped; the job resumes from the previous intact checkpoint
and succeeds, with the same losses as an uninterrupted run from there on."""

from __future__ import annotations

import pathlib
import signal
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from test_training_jobs import Events, assets, logs, losses_by_step, progress, spec, workspace  # noqa: E402,F401

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2


def flip_byte(path: pathlib.Path, from_end: int) -> None:
    data = bytearray(path.read_bytes())
    data[-from_end] ^= 0x40
    path.write_bytes(bytes(data))


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(binary_dir, workspace):
    # Killed at step 12 of 60: of 30, the 18 steps to spare were a window a loaded machine's event
    # delivery could miss (the job ended first, with no checkpoint to fall back from).
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
        saved = sorted(e.checkpoint_saved.step for e in first.events if e.HasField("checkpoint_saved"))
        assert len(saved) >= 2 and saved[-1] < steps, saved
        newest, previous = saved[-1], saved[-2]
        flip_byte(workspace / "crash" / f"checkpoint-{newest}" / "model-layer-00001.safetensors", 3)

        d.start()
        with offloadd.Client(d.target) as c:
            seen = []
            done = c.wait(job.id, timeout=180, on_event=seen.append)
            assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen), d.log()[-3000:])
            resumed = [m for m in logs(seen) if m.startswith("resuming from ")]
            assert resumed == [f"resuming from {workspace / 'crash' / f'checkpoint-{previous}'}"], logs(seen)
            assert "checksum mismatch" in d.log() and f"checkpoint-{newest}" in d.log()
            # The reason is in the job's own events too, not only the daemon's log.
            skipped = [m for m in logs(seen) if m.startswith("skipped ") and f"checkpoint-{newest}" in m]
            assert len(skipped) == 1 and "checksum mismatch" in skipped[0], logs(seen)
            ref_events = []
            ref = c.submit(spec(workspace, "reference", steps=steps, save_steps=save, accum=accum), wait=True,
                           timeout=180, on_event=ref_events.append)
            assert ref.state == S.JOB_STATE_SUCCEEDED, ref.error
    finally:
        d.stop()
    cursor = first.events[-1].cursor
    second = [e for e in seen if e.cursor > cursor]
    # Steps the first run reported are trained again from `previous` without new progress events
    #; the second run reports from the first step past them, and its losses
    # (which follow from the replayed state) match the uninterrupted run's.
    assert [p.step for p in progress(seen)] == list(range(1, steps + 1))
    killed_at = max(p.step for p in progress(first.events))
    first_new = progress(second)[0].step
    assert killed_at < first_new and previous < newest <= killed_at
    crashed, reference = losses_by_step(seen), losses_by_step(ref_events)
    after = range(first_new, steps + 1)
    assert [crashed[s] for s in after] == [reference[s] for s in after], "resumed losses differ"
