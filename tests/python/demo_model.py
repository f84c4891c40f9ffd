"""The README's demo for daemon tests: stories260K (a pretrained tiny Llama) converted to a Hugging
Face model directory by scripts/convert_llama2c.py, and Alpaca records. Read from ../shared/data,
or with shared_dir None from the repository's own copy in examples/data (the same model bytes, and
alpaca_300.json is alpaca_5000.json's first 300 records: see their PROVENANCE.md), so that a test
that needs nothing else runs from a plain clone."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys


def write_demo(root: pathlib.Path, shared_dir: pathlib.Path | None, source_dir: pathlib.Path,
               records: int = 64) -> pathlib.Path:
    """Writes root/stories260K/ and root/alpaca.json (the first `records` records); returns root."""
    if shared_dir is None:
        src = source_dir / "examples/data/stories260K"
        alpaca_file = source_dir / "examples/data/alpaca/alpaca_300.json"
        assert records <= 300, "examples/data holds 300 Alpaca records"
    else:
        src = shared_dir / "data/models/stories260K"
        alpaca_file = shared_dir / "data/alpaca/alpaca_5000.json"
    r = subprocess.run([sys.executable, str(source_dir / "scripts/convert_llama2c.py"), "--model",
                        str(src / "stories260K.bin"), "--tokenizer", str(src / "tok512.bin"), "--out",
                        str(root / "stories260K")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    alpaca = json.loads(alpaca_file.read_text())[:records]
    (root / "alpaca.json").write_text(json.dumps(alpaca))
    return root
