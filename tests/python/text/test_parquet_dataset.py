"""Parquet datasets (text/parquet_reader.h) against the same records in JSON Lines: files written
by pyarrow with Alpaca, ShareGPT (list<struct<from, value>>), messages (list<struct<role,
content>>) and pretokenized (list<int64>) records, under each codec offloadd reads (snappy, zstd,
gzip, none), dictionary and plain encodings, v1 and v2 data pages, several row groups and several
pages per column chunk, and a directory of shards, give offloadd-dataset the same documents and the
same packed batches as the JSON Lines file. Columns it does not read are refused naming the file,
the column and its type; truncated or corrupt files are errors naming the file, never a crash."""

import json

import pytest

from test_dataset import run_dataset
from text_testlib import DATA_DIR, TOK_DIR, glaive_records

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def alpaca_records():
    recs = json.loads((DATA_DIR / "alpaca" / "alpaca_5000.json").read_text("utf-8"))[:30]
    out = []
    for i, r in enumerate(recs):
        r = dict(r)
        if i % 3 == 0:
            r.pop("input", None)  # absent in JSON, null in Parquet: both read as no input
        if i % 5 == 0:
            r["system"] = "You are terse."
        out.append(r)
    return out


def sharegpt_records():
    return [{k: r[k] for k in ("conversations", "tools") if k in r} for r in glaive_records()[:20]]


def messages_records():
    out = []
    for i, r in enumerate(alpaca_records()[:15]):
        msgs = [{"role": "user", "content": r["instruction"]}, {"role": "assistant", "content": r["output"]}]
        if i % 2:
            msgs.insert(0, {"role": "system", "content": "Be brief."})
        out.append({"messages": msgs, "id": i})
    return out


def pretokenized_records():
    return [{"input_ids": list(range(5 + i, 25 + 2 * i)), "labels": [-100] * 3 + list(range(8 + i, 25 + 2 * i))}
            for i in range(12)]


DATASETS = {"alpaca": alpaca_records, "sharegpt": sharegpt_records, "messages": messages_records,
            "pretokenized": pretokenized_records}


def table(records):
    """The records as a table with a column per key of any record (pyarrow's from_pylist takes the
    first record's keys only): a key a record lacks is a null there."""
    keys = list(dict.fromkeys(k for r in records for k in r))
    return pa.table({k: [r.get(k) for r in records] for k in keys})


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def dataset_output(data, pack=None):
    args = ["--tokenizer", TOK_DIR / "gpt2", "--data", data, "--max-seq-length", 256, "--seed", 5]
    if pack:
        args += ["--pack", pack]
    _, stats, lines = run_dataset(args)
    return stats, lines


_JSONL = {}


def jsonl_output(tmp_path_factory, name):
    """The JSON Lines file's documents and packed batches (computed once per dataset)."""
    if name not in _JSONL:
        jsonl = write_jsonl(tmp_path_factory.mktemp("jsonl") / f"{name}.jsonl", DATASETS[name]())
        stats, docs = dataset_output(jsonl)
        _JSONL[name] = (stats, docs, dataset_output(jsonl, pack=40)[1])
    return _JSONL[name]


@pytest.mark.parametrize("name", sorted(DATASETS))
@pytest.mark.parametrize("compression,dictionary,page_version", [
    ("snappy", True, "1.0"), ("zstd", False, "2.0"), ("gzip", True, "2.0"), ("none", False, "1.0"),
    ("zstd", True, "1.0"), ("snappy", False, "2.0"),
])
def test_parquet_gives_the_batches_of_the_same_jsonl(tmp_path, tmp_path_factory, name, compression, dictionary, page_version):
    records = DATASETS[name]()
    parquet = tmp_path / "data.parquet"
    # Small row groups and pages: several of each per file and column chunk.
    pq.write_table(table(records), parquet, compression=compression, use_dictionary=dictionary,
                   data_page_version=page_version, row_group_size=7, data_page_size=256)
    assert pq.ParquetFile(parquet).metadata.num_row_groups > 1
    want_stats, want_docs, want_batches = jsonl_output(tmp_path_factory, name)
    got_stats, got_docs = dataset_output(parquet)
    assert got_docs == want_docs
    assert got_stats["records"] == want_stats["records"] == len(records)
    assert dataset_output(parquet, pack=40)[1] == want_batches


def test_a_directory_of_shards_reads_as_its_files_in_name_order(tmp_path):
    records = pretokenized_records()
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(3):  # written out of order: read by name
        part = records[4 * (2 - k):4 * (3 - k)]
        pq.write_table(table(part), shards / f"train-{2 - k:05d}-of-00003.parquet")
    jsonl = write_jsonl(tmp_path / "all.jsonl", records)
    assert dataset_output(shards, pack=10)[1] == dataset_output(jsonl, pack=10)[1]


def refusal(tmp_path, path):
    proc, _, _ = run_dataset(["--tokenizer", TOK_DIR / "gpt2", "--data", path], check=False)
    assert proc.returncode == 1, proc.stdout
    return proc.stderr


@pytest.mark.parametrize("column,value,named", [
    ("meta", pa.array([{"a": 1}], pa.map_(pa.string(), pa.int64())), "maps are not read"),
    ("blob", pa.array([b"\x00\x01"], pa.binary()), "BYTE_ARRAY"),
    ("when", pa.array([1], pa.timestamp("ms")), "TIMESTAMP"),
    ("nested", pa.array([[[1]]], pa.list_(pa.list_(pa.int32()))), "lists nested in lists"),
])
def test_unread_columns_are_refused_naming_column_and_type(tmp_path, column, value, named):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": ["hello"], column: value}), path)
    err = refusal(tmp_path, path)
    assert str(path) in err and f'column "{column}' in err and named in err, err


def test_truncated_and_corrupt_files_are_errors_naming_the_file(tmp_path):
    good = tmp_path / "good.parquet"
    pq.write_table(table(pretokenized_records()), good, compression="snappy")
    data = good.read_bytes()
    cases = {"truncated.parquet": data[: len(data) // 2], "tail.parquet": data[:-1],
             "footer.parquet": data[:-8] + (10**6).to_bytes(4, "little") + b"PAR1",
             "pages.parquet": data[:4] + bytes(b ^ 0x5A for b in data[4:200]) + data[200:]}
    for name, blob in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        err = refusal(tmp_path, path)
        assert str(path) in err, (name, err)
