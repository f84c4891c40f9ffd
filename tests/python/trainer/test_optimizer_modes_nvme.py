"""The compact optimizer modes with the states on the NVMe tier (docs/optimizer-modes.md).

offloadd-train (CPU, bf16 compute, clipping) runs each compact mode with `--tier=nvme` under a host
memory limit that keeps some blocks' master and states in RAM and puts the rest in the store, which
holds them in the mode's own bytes (bf16 or int8 codes with their block scales, a bf16 master with
its compensation) and stages them through slots of that size. The store keeps the bytes the
workers wrote, so the run must equal the same mode with every block in RAM bit for bit: every
step's loss and gradient norm, the checkpoint's states and the exported weights. A resume from the
NVMe run's checkpoint must end on the uninterrupted run's bits."""

from __future__ import annotations

import json
import pathlib
import re

import numpy as np
import pytest
from safetensors.numpy import load_file

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized

STEPS = 6
SAVE_STEPS = 3


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("modes_nvme")
    return build_model(d / "model", layers=4), write_pretokenized(d / "data.jsonl", n=128)


def args(job, out: pathlib.Path, state: str, master: str, *extra) -> list[str]:
    model, data = job
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu",
            "--dtype=bf16", "--batch-size=4", f"--max-steps={STEPS}", "--epochs=1000", "--lr=3e-3",
            "--weight-decay=0.1", "--max-grad-norm=0.5", "--seed=7", "--workers=1x1",
            f"--state-dtype={state}", f"--master-dtype={master}", f"--save-steps={SAVE_STEPS}",
            f"--output-dir={out}", f"--stats-jsonl={out}.stats.jsonl", *extra]


def nvme(out: pathlib.Path, limit: int | None = None) -> list[str]:
    return ["--tier=nvme", f"--nvme-dir={out}-store",
            *([f"--host-memory-limit={limit}"] if limit else [])]


def predicted_host_bytes(binary_dir, job, tmp: pathlib.Path, state, master, extra) -> int:
    r = run_train(binary_dir, args(job, tmp / "v", state, master, "--validate-only", *extra))
    return json.loads(next(l for l in r.stdout.splitlines() if l.startswith("{")))[
        "predicted_host_bytes"]


def differing(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    """file:tensor of every tensor that differs, byte for byte, between two directories'
    safetensors files (the same files on both sides)."""
    files_a = sorted(p.relative_to(a) for p in a.glob("*.safetensors"))
    files_b = sorted(p.relative_to(b) for p in b.glob("*.safetensors"))
    assert files_a == files_b and files_a, (files_a, files_b)
    out = []
    for f in files_a:
        x, y = load_file(str(a / f)), load_file(str(b / f))
        assert sorted(x) == sorted(y), f
        out += [f"{f}:{k}" for k in x if x[k].dtype != y[k].dtype or not np.array_equal(
            x[k].view(np.uint8), y[k].view(np.uint8))]
    return out


@pytest.mark.parametrize("state,master", [("bf16", "fp32"), ("int8", "fp32"), ("fp32", "bf16"),
                                          ("int8", "bf16")])
def test_compact_states_on_nvme_train_and_resume_like_ram_bit_for_bit(binary_dir, job, tmp_path,
                                                                      state, master):
    # A limit between every block's states on NVMe and every block in RAM splits them.
    low = predicted_host_bytes(binary_dir, job, tmp_path, state, master, nvme(tmp_path / "v"))
    high = predicted_host_bytes(binary_dir, job, tmp_path, state, master,
                                nvme(tmp_path / "v", 16 << 30))
    assert high > low, (low, high)
    limit = low + (high - low) // 2

    ram, mixed, resumed = tmp_path / "ram", tmp_path / "nvme", tmp_path / "resumed"
    r_ram = run_train(binary_dir, args(job, ram, state, master))
    r_nvme = run_train(binary_dir, args(job, mixed, state, master, *nvme(mixed, limit)))
    mode = f"optimizer not exact: {master} master, {state} states"
    assert mode in r_ram.stderr and mode in r_nvme.stderr, r_nvme.stderr[-3000:]
    placed = re.search(r"optimizer states in RAM and NVMe: blocks (.+?) in RAM \([^)]*\), (.+?) on "
                       r"NVMe", r_nvme.stderr)
    assert placed, r_nvme.stderr[-3000:]
    print(f"{master} master, {state} states: limit {limit} (all on NVMe {low}, all in RAM {high}):"
          f" blocks {placed.group(1)} in RAM, {placed.group(2)} on NVMe")

    a, b = read_stats(pathlib.Path(f"{ram}.stats.jsonl")), read_stats(
        pathlib.Path(f"{mixed}.stats.jsonl"))
    assert len(a) == len(b) == STEPS
    assert [(s["loss"], s["grad_norm"]) for s in a] == [(s["loss"], s["grad_norm"]) for s in b]
    assert len({s["loss"] for s in a}) > 1, "the steps train"
    # The checkpoint's states in the mode's own format, and the export.
    assert differing(ram / f"checkpoint-{SAVE_STEPS}", mixed / f"checkpoint-{SAVE_STEPS}") == []
    assert differing(ram, mixed) == []

    # Resume the NVMe run's checkpoint (in another store directory) to the end.
    run_train(binary_dir, args(job, resumed, state, master, *nvme(resumed, limit),
                               f"--resume-from={mixed}/checkpoint-{SAVE_STEPS}"))
    c = read_stats(pathlib.Path(f"{resumed}.stats.jsonl"))
    assert [s["step"] for s in c] == list(range(SAVE_STEPS + 1, STEPS + 1))
    assert [(s["loss"], s["grad_norm"]) for s in c] == \
        [(s["loss"], s["grad_norm"]) for s in b[SAVE_STEPS:]]
    assert differing(mixed, resumed) == []
