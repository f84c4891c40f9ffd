"""Writes the Arrow IPC seeds of fuzz/arrow_fuzzer.cc with pyarrow: chat, Alpaca (with a history
list of lists) and pretokenized tables as streams (what datasets' save_to_disk writes), plain and
with ZSTD-compressed buffers, and as an IPC file ("ARROW1")."""

import pathlib

import pyarrow as pa
import pyarrow.ipc as ipc

HERE = pathlib.Path(__file__).parent
CHAT = [{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                      {"role": "assistant", "content": "4"}]},
        {"messages": None}, {"messages": []}]
ALPACA = [{"instruction": "Name a colour.", "input": None, "output": "Blue", "n": 1, "history": [["a", "b"]]},
          {"instruction": "Add", "input": "2 and 3", "output": "5", "n": None, "history": []}]
TOKENS = [{"input_ids": [1, 2, 3, 4], "labels": [-100, 2, 3, 4], "ok": True, "w": 0.5},
          {"input_ids": [5, 6], "labels": None, "ok": False, "w": None}]

for name, rows in {"chat": CHAT, "alpaca": ALPACA, "tokens": TOKENS}.items():
    table = pa.Table.from_pylist(rows)
    for kind, options in [("plain", None), ("zstd", ipc.IpcWriteOptions(compression="zstd"))]:
        with ipc.new_stream(HERE / f"{name}_{kind}.arrow", table.schema, options=options) as w:
            for batch in table.to_batches(max_chunksize=1):
                w.write_batch(batch)
    with ipc.new_file(HERE / f"{name}_file.arrow", table.schema) as w:
        w.write_table(table)
