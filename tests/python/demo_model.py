"""The README's demo for daemon tests: stories260K (../shared/data, a pretrained tiny Llama)
converted to a Hugging Face model directory by scripts/convert_llama2c.py, and Alpaca records."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys


def write_demo(root: pathlib.Path, shared_dir: pathlib.Path, source_dir: pathlib.Path, records: int = 64) -> pathlib.Path:
    """Writes root/stories260K/ and root/alpaca.json (the first `records` records); returns root."""
    src = shared_dir / "data/models/stories260K"
    r = subprocess.run([sys.executable, str(source_dir / "scripts/convert_llama2c.py"), "--model",
                        str(src / "stories260K.bin"), "--tokenizer", str(src / "tok512.bin"), "--out",
                        str(root / "stories260K")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    alpaca = json.loads((shared_dir / "data/alpaca/alpaca_5000.json").read_text())[:records]
    (root / "alpaca.json").write_text(json.dumps(alpaca))
    return root
