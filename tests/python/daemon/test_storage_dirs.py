"""Through the real daemon: a configured storage directory that is missing (an
NVMe not mounted) is reported as missing, naming its path, at startup and when a job asks for the
NVMe tier; it was reported as "none is configured"."""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from test_training_jobs import assets, spec, workspace  # noqa: E402,F401

import offloadd  # noqa: E402


def test_a_missing_storage_directory_is_named(binary_dir, workspace):
    missing = workspace / "nvme-not-mounted"
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace)
    d.config_path.write_text(d.config_path.read_text().replace(f"- path: {workspace}\n", f"- path: {missing}\n"))
    d.start()
    try:
        warning = [ln for ln in d.log().splitlines() if "storage.directories[0]" in ln]
        assert warning and str(missing) in warning[0] and "missing" in warning[0], d.log()[-2000:]
        with offloadd.Client(d.target) as c:
            s = spec(workspace, "out", steps=2, save_steps=10)
            s["offload"] = {"offload_optimizer": {"device": "nvme"}}
            with pytest.raises(offloadd.OffloaddError) as e:
                c.create_job(s, validate_only=True)
        text = str(e.value)
        assert str(missing) in text and "missing" in text and "none is configured" not in text, text
    finally:
        d.stop()
