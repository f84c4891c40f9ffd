"""Issue #15 item 4 through the daemon: a job with resources.gpus 2 on a node without GPUs runs two
CPU executors that form a Gloo group, each on its half of every global batch, and trains what one
executor trains on the whole batch: per-step losses within 1e-5 and final weights within 2e-5 (the
CPU parity tests' bounds, as in tests/python/trainer/test_data_parallel.py)."""

from __future__ import annotations

import pathlib
import sys

from safetensors.torch import load_file

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402
from test_training_jobs import logs, progress, spec  # noqa: E402

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

S = job_pb2


def test_two_cpu_executors_train_like_one_on_the_whole_batch(binary_dir, tmp_path):
    build_model(tmp_path / "model", layers=2)
    write_pretokenized(tmp_path / "data.jsonl", n=64)
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", tmp_path).start()
    runs = {}
    try:
        with offloadd.Client(d.target) as c:
            for name, gpus, batch in (("one", 1, 4), ("two", 2, 2)):
                s = spec(tmp_path, name, steps=8, save_steps=100)
                s["training"]["per_device_train_batch_size"] = batch
                s["resources"] = {"gpus": gpus}
                seen = []
                done = c.submit(s, wait=True, timeout=300, on_event=seen.append)
                assert done.state == S.JOB_STATE_SUCCEEDED, (done.error, logs(seen))
                runs[name] = (progress(seen), logs(seen))
    finally:
        d.stop()
    (one, _), (two, two_logs) = runs["one"], runs["two"]
    # Two executors, ranks 0 and 1, in one Gloo group; only rank 0 reports progress.
    started = [m for m in two_logs if m.startswith("executor started")]
    assert len(started) == 2 and any(" rank 1 " in m for m in started), started
    assert any("data parallel: rank 0 of 2 (gloo" in m for m in two_logs), two_logs
    assert [p.step for p in one] == [p.step for p in two] == list(range(1, 9))
    for a, b in zip(one, two):
        assert a.tokens_seen == b.tokens_seen
        assert abs(a.loss - b.loss) <= 1e-5, (a.step, a.loss, b.loss)
    wa, wb = load_file(tmp_path / "one" / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    for name in wa:
        assert (wa[name] - wb[name]).abs().max().item() <= 2e-5, name
