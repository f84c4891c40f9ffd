"""The README's demo from a plain clone: its model and data are in the repository (examples/data,
with their provenance and licences), scripts/demo_prepare.sh (what scripts/demo.sh runs before it
submits) builds the demo's inputs from a copy of the repository with nothing beside it, and the job
it writes, examples/job.yaml with its paths moved, passes the daemon's validation."""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

SOURCE = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[3]))
BUILD = pathlib.Path(os.environ.get("OFFLOADD_BINARY_DIR", SOURCE / "build"))
sys.path.insert(0, str(SOURCE / "tests/python/daemon"))
from daemon_process import DaemonProcess  # noqa: E402


def provenance_rows(folder: pathlib.Path) -> dict[str, tuple[int, str]]:
    """file -> (bytes, sha256) from the table of folder/PROVENANCE.md."""
    rows = {}
    for m in re.finditer(r"^\| `([^`]+)` \| ([\d,]+) \| `([0-9a-f]{64})` \|", (folder / "PROVENANCE.md").read_text(), re.M):
        rows[m.group(1)] = (int(m.group(2).replace(",", "")), m.group(3))
    return rows


@pytest.mark.parametrize("folder", ["stories260K", "alpaca"])
def test_example_data_is_what_its_provenance_says(folder):
    d = SOURCE / "examples/data" / folder
    rows = provenance_rows(d)
    data = sorted(p.name for p in d.iterdir() if p.name not in ("PROVENANCE.md", "LICENSE"))
    assert sorted(rows) == data, "every data file has a PROVENANCE.md row, and every row a file"
    for name, (size, sha) in rows.items():
        blob = (d / name).read_bytes()
        assert (len(blob), hashlib.sha256(blob).hexdigest()) == (size, sha), name
    assert (d / "LICENSE").stat().st_size > 0


def test_alpaca_licence_is_stated_as_non_commercial():
    text = (SOURCE / "examples/data/alpaca/PROVENANCE.md").read_text()
    assert "CC BY-NC 4.0" in text and "non-commercial" in text
    assert "Attribution-NonCommercial 4.0 International" in (SOURCE / "examples/data/alpaca/LICENSE").read_text()
    assert "CC BY-NC 4.0" in (SOURCE / "README.md").read_text()


def test_demo_needs_nothing_beside_the_repository():
    for script in ("scripts/demo.sh", "scripts/demo_prepare.sh"):
        assert "shared" not in (SOURCE / script).read_text(), f"{script} still refers to ../shared"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """scripts/demo_prepare.sh run in a copy of the repository's demo files, with no ../shared."""
    root = tmp_path_factory.mktemp("plain")
    clone = root / "clone"
    for rel in ("scripts/demo_prepare.sh", "scripts/convert_llama2c.py", "examples"):
        src, dst = SOURCE / rel, clone / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst) if src.is_dir() else shutil.copy2(src, dst)
    assert not (root / "shared").exists()
    demo = root / "demo"
    r = subprocess.run(["bash", clone / "scripts/demo_prepare.sh", demo], capture_output=True, text=True,
                       env=dict(os.environ, PYTHON=sys.executable), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(demo / "job.yaml")
    return demo


def test_prepared_job_is_examples_job_yaml_with_its_paths_moved(prepared):
    want = (SOURCE / "examples/job.yaml").read_text().replace("/srv/offloadd/", f"{prepared}/")
    assert (prepared / "job.yaml").read_text() == want
    model = prepared / "models/stories260K"
    for f in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (model / f).is_file(), f
    assert (prepared / "data/alpaca_300.json").read_bytes() == (SOURCE / "examples/data/alpaca/alpaca_300.json").read_bytes()


def test_prepared_job_validates_on_the_daemon(prepared):
    offloadd, offloadctl = BUILD / "daemon/offloadd", BUILD / "client/offloadctl"
    if not offloadd.exists() or not offloadctl.exists():
        pytest.skip(f"offloadd and offloadctl not built in {BUILD}")
    d = DaemonProcess(offloadd, prepared).start()
    try:
        r = subprocess.run([offloadctl, "--target", d.target, "submit", prepared / "job.yaml", "--validate-only"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "stories260k-alpaca" in r.stdout, r.stdout
    finally:
        d.stop()


def test_text_tests_that_read_the_shared_folder_skip_without_it(tmp_path):
    """The README's test command from a plain clone (no ../shared beside it): the text tests that
    read its real tokenizers and corpora skip, naming the folder, instead of failing on a missing
    file (or reading some other copy of it); those that need none still run."""
    clone = tmp_path / "clone"
    clone.mkdir()
    text = SOURCE / "tests/python/text"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        f"{text}/test_dataset.py::test_lima_multi_turn_history",
                        f"{text}/test_chat_template.py::test_jinja_errors_are_reported"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path,
                       env=dict(os.environ, OFFLOADD_SOURCE_DIR=str(clone), OFFLOADD_BINARY_DIR=str(BUILD)))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    reason = f"{tmp_path / 'shared' / 'data'} (the shared data folder"
    skipped = [line for line in r.stdout.splitlines() if line.startswith("SKIPPED")]
    assert len([s for s in skipped if reason in s and "test_dataset.py" in s]) == 1, r.stdout
    assert not [s for s in skipped if reason in s and "test_chat_template.py" in s], r.stdout


def test_demo_script_trains_the_demo_job_to_the_end():
    """The README's first command, scripts/demo.sh, as written, on the build tree the suite runs on
    (up to date, so it configures and builds nothing new): the daemon serves, the demo job trains
    its 30 steps to SUCCEEDED, the fine-tuned model is in its output directory, and the daemon
    stops cleanly. CI runs this in a fresh clone."""
    programs = ("daemon/offloadd", "client/offloadctl", "executor/offloadd-executor")
    if not all((BUILD / p).exists() for p in programs):
        pytest.skip(f"{', '.join(programs)} not built in {BUILD}")
    r = subprocess.run(["bash", SOURCE / "scripts/demo.sh"], capture_output=True, text=True, timeout=840,
                       env=dict(os.environ, OFFLOADD_BUILD_DIR=str(BUILD)))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "step 30/30" in r.stdout and "state succeeded" in r.stdout, r.stdout[-4000:]
    out = BUILD / "demo/out/stories260k-alpaca"
    assert f"written to {out}" in r.stdout, r.stdout[-2000:]
    for f in ("config.json", "model.safetensors", "tokenizer.json", "README.md"):
        assert (out / f).is_file(), f
    assert "offloadd stopped cleanly" in r.stdout, r.stdout[-2000:]
