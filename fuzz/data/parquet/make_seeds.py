"""Writes the Parquet seeds of fuzz/parquet_fuzzer.cc with pyarrow: small chat, Alpaca and
pretokenized tables under each codec, page version and encoding the reader takes."""

import pathlib

import pyarrow as pa
import pyarrow.parquet as pq

HERE = pathlib.Path(__file__).parent
CHAT = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}]},
        {"messages": None}, {"messages": []}]
ALPACA = [{"instruction": "Name a colour.", "input": None, "output": "Blue", "n": 1},
          {"instruction": "Add", "input": "2 and 3", "output": "5", "n": None}]
TOKENS = [{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4], "ok": True},
          {"input_ids": [5, 6], "labels": None, "ok": False}]

for name, rows in {"chat": CHAT, "alpaca": ALPACA, "tokens": TOKENS}.items():
    for codec, dictionary, version in [("snappy", True, "1.0"), ("zstd", False, "2.0"), ("gzip", True, "2.0"),
                                       ("none", False, "1.0")]:
        pq.write_table(pa.Table.from_pylist(rows), HERE / f"{name}_{codec}_{'dict' if dictionary else 'plain'}_v{version[0]}.parquet",
                       compression=codec, use_dictionary=dictionary, data_page_version=version, row_group_size=1)
