"""offloadd-train refuses a named pipe (FIFO) or a device given as a dataset file instead of blocking
in open(2) for good. Bounded by a timeout: before the fix the run hung."""

import os
import stat
import subprocess

import pytest

from pipeline_testlib import build_model

TIMEOUT_S = 60


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_fifo_or_device_dataset_is_refused(binary_dir, tmp_path, kind):
    model = build_model(tmp_path / "model")
    data = tmp_path / "data.jsonl"
    if kind == "fifo":
        os.mkfifo(data)
    else:
        os.mknod(data, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
           "--format=pretokenized", "--max-steps=1", "--workers=1x1", "--device=cpu", "--no-export",
           f"--output-dir={tmp_path / 'out'}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"offloadd-train blocked for {TIMEOUT_S} s on a {kind} given as the dataset")
    print(r.stderr[-500:])
    assert r.returncode != 0
    assert f"'{data}' is not a regular file" in r.stderr, r.stderr
    assert "step 1/" not in r.stdout
