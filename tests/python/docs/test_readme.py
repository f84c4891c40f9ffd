"""The README a newcomer follows: two set-up commands, a complete job (examples/job.yaml, quoted
verbatim), a sizing table that is the validator's own estimate, the NVIDIA driver the bundled CUDA
needs, a link to every document in docs/, and no sentence that the code contradicts."""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

SOURCE = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).resolve().parents[3]))
BUILD = pathlib.Path(os.environ.get("OFFLOADD_BINARY_DIR", SOURCE / "build"))
README = (SOURCE / "README.md").read_text()


def section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## )", README, re.M | re.S)
    assert m, f"README has no section '{title}'"
    return m.group(1)


def test_every_doc_is_linked_from_the_readme():
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README))
    docs = {f"docs/{p.name}" for p in (SOURCE / "docs").glob("*.md")}
    assert docs - linked == set(), f"not linked from README.md: {sorted(docs - linked)}"


def test_quick_start_has_exactly_two_commands():
    blocks = re.findall(r"```sh\n(.*?)```", section("Quick start"), re.S)
    assert [b.strip() for b in blocks] == ["scripts/demo.sh", "scripts/test.sh"]


def test_readme_job_is_examples_job_yaml():
    m = re.search(r"<!-- job-yaml: examples/job.yaml -->\n```yaml\n(.*?)```", README, re.S)
    assert m, "README.md does not quote examples/job.yaml"
    assert m.group(1) == (SOURCE / "examples/job.yaml").read_text()
    own = section("Your own model and data")
    assert "offloadctl submit job.yaml --watch" in own and "output_dir" in own


def test_sizing_table_is_the_validators_estimate():
    if not (BUILD / "daemon/offloadd-sizing").exists():
        pytest.skip(f"offloadd-sizing not built in {BUILD}")
    r = subprocess.run([sys.executable, SOURCE / "scripts/sizing_table.py", "--build", BUILD, "--check",
                        SOURCE / "README.md"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_sizing_rule_states_the_bytes_per_parameter():
    own = section("Your own model and data")
    for rule in ("14 bytes per parameter", "12 bytes per parameter plus the new versions", "12 bytes per",
                 "a reserve of 4 GiB or 6% of RAM"):
        assert rule in own, rule


# NVIDIA's CUDA compatibility table: the oldest driver of each CUDA major version.
DRIVER_FLOOR = {11: 450, 12: 525, 13: 580}


def test_driver_floor_matches_the_pinned_torch():
    pin = re.search(r"^torch==([\d.]+)", (SOURCE / "python-requirements.txt").read_text(), re.M)
    assert pin and f"torch=={pin.group(1)}" in README
    m = re.search(r"torch==([\d.]+)\+cu(\d+)\d`, which needs an\s+NVIDIA driver of version (\d+) or newer", README)
    assert m, "README does not state the driver the bundled CUDA needs"
    assert m.group(1) == pin.group(1)
    assert int(m.group(3)) == DRIVER_FLOOR[int(m.group(2))]
    try:
        import torch
    except ImportError:
        return
    if torch.version.cuda:  # the wheel the build bundles
        assert int(torch.version.cuda.split(".")[0]) == int(m.group(2)), torch.version.cuda


def test_no_sentence_says_the_planner_does_not_choose_the_batch_size():
    flat = " ".join(README.split())
    assert "the batch size are not yet choices" not in flat
    assert "`per_device_train_batch_size: auto` the planner also chooses the micro-batch" in flat
