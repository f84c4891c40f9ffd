"""Hugging Face save_to_disk directories (text/arrow_ipc_reader.h) against the same records in JSON
Lines: Alpaca, ShareGPT, messages and pretokenized records saved by `datasets` itself
(Dataset.from_list(...).save_to_disk, several shards), and Arrow streams written by pyarrow with
ZSTD-compressed buffers, give offloadd-dataset the same documents and packed batches as the JSON
Lines file. A DatasetDict directory is refused naming its splits; unread column types name the
column; a truncated data file is an error naming it."""

import json

import pytest

from test_dataset import run_dataset
from test_parquet_dataset import DATASETS, dataset_output, jsonl_output, table
from text_testlib import TOK_DIR

datasets = pytest.importorskip("datasets")
pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_save_to_disk_gives_the_batches_of_the_same_jsonl(tmp_path, tmp_path_factory, name):
    records = DATASETS[name]()
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict(table(records).to_pydict()).save_to_disk(str(saved), num_shards=3)
    assert len(list(saved.glob("data-*.arrow"))) == 3
    want_stats, want_docs, want_batches = jsonl_output(tmp_path_factory, name)
    got_stats, got_docs = dataset_output(saved)
    assert got_docs == want_docs
    assert got_stats["records"] == len(records)
    assert dataset_output(saved, pack=40)[1] == want_batches


@pytest.mark.parametrize("name", ["messages", "alpaca"])
def test_zstd_compressed_arrow_stream_gives_the_same_batches(tmp_path, tmp_path_factory, name):
    t = table(DATASETS[name]())
    path = tmp_path / "data.arrow"
    with ipc.new_stream(path, t.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
        for batch in t.to_batches(max_chunksize=4):
            w.write_batch(batch)
    _, want_docs, want_batches = jsonl_output(tmp_path_factory, name)
    assert dataset_output(path)[1] == want_docs
    assert dataset_output(path, pack=40)[1] == want_batches


def failure(path):
    proc, _, _ = run_dataset(["--tokenizer", TOK_DIR / "gpt2", "--data", path], check=False)
    assert proc.returncode == 1, proc.stdout
    return proc.stderr


def test_dataset_dicts_unread_columns_and_truncated_files_are_refused_by_name(tmp_path):
    recs = [{"text": "hello"}, {"text": "world"}]
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_list(recs), "test": datasets.Dataset.from_list(recs)})
    dd.save_to_disk(str(tmp_path / "dict"))
    err = failure(tmp_path / "dict")
    assert "a DatasetDict" in err and str(tmp_path / "dict" / "train") in err, err
    assert dataset_output(tmp_path / "dict" / "train")[0]["records"] == 2

    blob = tmp_path / "blob"
    datasets.Dataset.from_dict({"text": ["a"], "raw": [b"\x00"]}).save_to_disk(str(blob))
    err = failure(blob)
    assert 'column "raw" of type Binary' in err and "data-00000-of-00001.arrow" in err, err

    saved = tmp_path / "cut"
    datasets.Dataset.from_list(recs * 50).save_to_disk(str(saved))
    data = next(saved.glob("data-*.arrow"))
    data.write_bytes(data.read_bytes()[:-200])
    err = failure(saved)
    assert str(data) in err, err
