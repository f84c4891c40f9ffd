"""Parquet and save_to_disk datasets through the real daemon (CPU, fp32): CreateJob's validation
previews them as the job reads them (a Parquet file, a directory of shards, a save_to_disk
directory are accepted; an unread column is refused under dataset.paths[0] naming it), and a job
trained from the Parquet file has the losses of the same job on the same records in JSON Lines."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from test_training_jobs import assets, daemon, logs, progress, spec, workspace  # noqa: E402,F401

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
datasets = pytest.importorskip("datasets")


def records(ws: pathlib.Path) -> list[dict]:
    return [json.loads(l) for l in (ws / "data.jsonl").read_text().splitlines() if l]


def with_data(ws: pathlib.Path, out: str, data: pathlib.Path, **kw) -> dict:
    s = spec(ws, out, **kw)
    s["dataset"]["paths"] = [str(data)]
    return s


def test_validation_previews_parquet_and_save_to_disk_and_names_unread_columns(daemon, workspace):
    recs = records(workspace)
    pq.write_table(pa.Table.from_pylist(recs), workspace / "data.parquet", row_group_size=16)
    shards = workspace / "shards"
    shards.mkdir()
    for k in range(2):
        pq.write_table(pa.Table.from_pylist(recs[32 * k:32 * (k + 1)]), shards / f"part-{k}.parquet")
    datasets.Dataset.from_list(recs).save_to_disk(str(workspace / "saved"))
    bad = workspace / "bad.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2]], "meta": pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64()))}), bad)
    with offloadd.Client(daemon.target) as c:
        for data in ("data.parquet", "shards", "saved"):
            c.create_job(with_data(workspace, "v", workspace / data, steps=2, save_steps=10), validate_only=True)
        with pytest.raises(offloadd.InvalidArgument) as e:
            c.create_job(with_data(workspace, "v", bad, steps=2, save_steps=10), validate_only=True)
    fields = {v.field: v.description for v in e.value.field_violations}
    assert 'column "meta"' in fields.get("dataset.paths[0]", ""), fields


def test_a_parquet_job_trains_like_the_same_jsonl_job(daemon, workspace):
    pq.write_table(pa.Table.from_pylist(records(workspace)), workspace / "data.parquet", compression="zstd",
                   row_group_size=10)
    losses = {}
    with offloadd.Client(daemon.target) as c:
        for name, data in (("jsonl", workspace / "data.jsonl"), ("parquet", workspace / "data.parquet")):
            seen = []
            done = c.submit(with_data(workspace, name, data, steps=4, save_steps=10), wait=True, timeout=120,
                            on_event=seen.append)
            assert done.state == job_pb2.JOB_STATE_SUCCEEDED, (done.error, logs(seen))
            losses[name] = [(p.step, p.loss) for p in progress(seen)]
    assert losses["parquet"] == losses["jsonl"] and len(losses["jsonl"]) == 4
