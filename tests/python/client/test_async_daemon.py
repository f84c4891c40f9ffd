"""End to end: a tiny job on the real daemon (CPU, fp32, the 2-layer demo Llama)
driven through offloadd.AsyncClient, and its result object: status "succeeded", the exported model
directory (model.safetensors in it), trained tokens, steps and final loss as the daemon reported."""

from __future__ import annotations

import asyncio
import pathlib
import sys

import pytest

HERE = pathlib.Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "daemon"))
sys.path.insert(0, str(HERE.parent / "trainer"))
from daemon_process import DaemonProcess  # noqa: E402

import offloadd  # noqa: E402

STEPS = 4


@pytest.fixture()
def daemon(binary_dir, tmp_path):
    binary = binary_dir / "daemon" / "offloadd"
    if not binary.exists():
        pytest.skip(f"{binary} is not built")
    pipeline_testlib = pytest.importorskip("pipeline_testlib", reason="needs torch and transformers")
    pipeline_testlib.build_model(tmp_path / "model", layers=2)
    pipeline_testlib.write_pretokenized(tmp_path / "data.jsonl", n=32)
    d = DaemonProcess(binary, tmp_path).start()
    yield d
    d.stop()


def job(ws: pathlib.Path) -> dict:
    return {
        "display_name": "async-sdk",
        "model": {"path": str(ws / "model"), "compute_dtype": "fp32"},
        "dataset": {"paths": [str(ws / "data.jsonl")], "format": "pretokenized", "max_seq_length": 64},
        "training": {"learning_rate": 3e-3, "per_device_train_batch_size": 4, "max_steps": STEPS,
                     "logging_steps": 1, "save_steps": 2, "seed": 7},
        "output_dir": str(ws / "out"),
    }


def test_a_job_through_the_async_client_and_its_result(daemon):
    ws = daemon.workdir

    async def main():
        async with offloadd.AsyncClient(daemon.target) as c:
            assert await c.health() == "SERVING"
            queued = await c.create_job(job(ws))
            assert offloadd.JobState.of(queued) in ("queued", "running")
            states = [offloadd.JobState.of(e) async for e in c.watch_job(queued.id) if e.HasField("state_change")]
            listed = [j.id async for j in c.list_jobs(states=["succeeded"])]
            return queued.id, states, listed, await c.result(queued.id, raise_on_failure=True, timeout=300)

    try:
        job_id, states, listed, r = asyncio.run(main())
    except offloadd.JobError as e:
        pytest.fail(f"{e}\n{daemon.log()[-3000:]}")
    assert states[-1] == "succeeded" and "running" in states, states
    assert job_id in listed
    assert isinstance(r, offloadd.JobResult) and r.id == job_id
    assert r.status == "succeeded" and r.succeeded and r.error is None
    assert r.steps == STEPS and r.max_steps == STEPS and r.trained_tokens > 0
    assert r.final_loss is not None and r.final_loss > 0
    assert r.output_dir == str(ws / "out")
    model = pathlib.Path(r.fine_tuned_model)
    assert model.is_dir() and (model / "model.safetensors").is_file() and (model / "config.json").is_file()
    assert r.created_at <= r.started_at <= r.finished_at
    assert r.latest_checkpoint_step == 2
    assert r.to_dict()["status"] == "succeeded"
