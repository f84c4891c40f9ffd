"""The 16-bit weights on NVMe (offload_param: {device: nvme}, offloadd-train --param-tier=nvme).

offloadd-train (CPU, bf16 compute, clipping, gradient accumulation) runs with the optimizer states
on the NVMe tier and every block's 16-bit weights in the store too: the trainer reads each block's
weights back before its forward and its backward (WeightResidency, the next block's read in flight
while one computes). The weights in RAM and on NVMe are the same bits, so the run must equal the
RAM tier's bit for bit: the exported weights, every state of the checkpoint and the logged losses.
A resume may change the placement (RAM tier, states on NVMe with the weights in RAM, weights on
NVMe) without changing the result."""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess

import pytest

from pipeline_testlib import build_model, write_pretokenized

TIMEOUT_S = 180


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def job(request, tmp_path_factory):
    d = tmp_path_factory.mktemp("weights_on_nvme")
    return (build_model(d / "model", layers=3, tied=request.param),
            write_pretokenized(d / "data.jsonl", n=128))


def train(binary_dir, job, out: pathlib.Path, placement: str, steps: int, *extra) -> tuple[str, list]:
    """Runs offloadd-train to `steps` (a checkpoint every 3 steps) at `placement`: "ram" (the RAM
    tier), "nvme" (states on NVMe, weights in RAM) or "nvme+weights"; returns its stderr and the
    (step, loss, lr, grad_norm) it printed for each step."""
    model, data = job
    tier = {"ram": [],
            "nvme": ["--tier=nvme", f"--nvme-dir={out}-store"],
            "nvme+weights": ["--tier=nvme", f"--nvme-dir={out}-store", "--param-tier=nvme"]}[placement]
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
           "--format=pretokenized", f"--max-steps={steps}", "--epochs=1000", "--workers=1x1",
           "--device=cpu", "--dtype=bf16", "--max-grad-norm=0.5", "--lr=3e-3", "--seed=7",
           "--grad-accum=2", "--batch-size=4", "--save-steps=3", f"--output-dir={out}", *tier, *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert r.returncode == 0, r.stderr[-3000:]
    steps_printed = re.findall(r"^step (\d+)/\d+ loss (\S+) lr (\S+) grad_norm (\S+)", r.stdout, re.M)
    assert steps_printed, r.stdout[-2000:]
    return r.stderr, steps_printed


def tensors(path: pathlib.Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


def differing(a: pathlib.Path, b: pathlib.Path) -> list[str]:
    """The names of the tensors (file:tensor) that differ between two checkpoints' or exports'
    safetensors files, compared byte for byte."""
    import numpy as np

    files_a = sorted(p.relative_to(a) for p in a.rglob("*.safetensors"))
    files_b = sorted(p.relative_to(b) for p in b.rglob("*.safetensors"))
    assert files_a == files_b and files_a, (files_a, files_b)
    out = []
    for f in files_a:
        x, y = tensors(a / f), tensors(b / f)
        assert sorted(x) == sorted(y), f
        for k in x:
            if x[k].dtype != y[k].dtype or x[k].shape != y[k].shape or not np.array_equal(
                    np.frombuffer(x[k].tobytes(), np.uint8), np.frombuffer(y[k].tobytes(), np.uint8)):
                out.append(f"{f}:{k}")
    return out


def losses(checkpoint: pathlib.Path) -> list[tuple]:
    """(step, loss, grad_norm) of every logged step, at full precision (Hugging Face's
    trainer_state.json)."""
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    out = [(h["step"], h["loss"], h.get("grad_norm")) for h in history if "loss" in h]
    assert out, history
    return out


def weights_line(stderr: str) -> str:
    m = re.search(r"16-bit weights of blocks [^()]* on NVMe \([^)]*\)", stderr)
    return m.group(0) if m else ""


def test_weights_on_nvme_train_like_ram_bit_for_bit(binary_dir, job, tmp_path):
    ram = tmp_path / "ram"
    # Four steps: the checkpoint of step 3 holds the states after 3 (the last step exports).
    _, ram_steps = train(binary_dir, job, ram, "ram", 4)
    nvme = tmp_path / "nvme"
    text, nvme_steps = train(binary_dir, job, nvme, "nvme+weights", 4)
    # Every block's weights were on NVMe (the plan names them: the embedding, 3 layers, the head).
    assert weights_line(text).startswith("16-bit weights of blocks 0-4 on NVMe"), text[-3000:]
    assert differing(ram / "checkpoint-3", nvme / "checkpoint-3") == []
    assert differing(ram, nvme) == []  # the export (model.safetensors) and the checkpoint again
    assert losses(ram / "checkpoint-3") == losses(nvme / "checkpoint-3")
    assert ram_steps == nvme_steps and len(nvme_steps) == 4, (ram_steps, nvme_steps)


def test_a_resume_may_change_where_the_weights_live(binary_dir, job, tmp_path):
    # Seven steps with the weights on NVMe, uninterrupted (checkpoints at 3 and 6); then its step-3 checkpoint resumed at two
    # other placements, and a RAM-tier checkpoint resumed with the weights on NVMe.
    ref = tmp_path / "ref"
    train(binary_dir, job, ref, "nvme+weights", 7)
    for i, (first, second) in enumerate([("nvme+weights", "ram"), ("nvme+weights", "nvme"),
                                         ("ram", "nvme+weights")]):
        out = tmp_path / f"run{i}"
        if first == "nvme+weights":
            shutil.copytree(ref / "checkpoint-3", out / "checkpoint-3")
        else:
            train(binary_dir, job, tmp_path / f"first{i}", first, 7)
            shutil.copytree(tmp_path / f"first{i}" / "checkpoint-3", out / "checkpoint-3")
        text, _ = train(binary_dir, job, out, second, 7, f"--resume-from={out / 'checkpoint-3'}")
        assert ("16-bit weights of blocks" in text) == (second == "nvme+weights"), text[-2000:]
        assert differing(ref, out) == [], (first, second)  # checkpoints 3 and 6, the export
        assert losses(ref / "checkpoint-6") == losses(out / "checkpoint-6"), (first, second)


def test_weights_on_nvme_are_refused_where_they_cannot_act(binary_dir, job, tmp_path):
    model, data = job
    base = [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
            "--format=pretokenized", "--max-steps=1", "--device=cpu", "--workers=1x1",
            f"--output-dir={tmp_path / 'out'}", "--param-tier=nvme"]
    for extra, want in [(["--dtype=bf16"], "need the optimizer states on NVMe"),
                        (["--dtype=fp32", "--tier=nvme", f"--nvme-dir={tmp_path / 's'}"],
                         "need 16-bit compute")]:
        r = subprocess.run(base + extra, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert r.returncode != 0 and want in r.stderr, r.stderr[-2000:]
        assert "--param-tier=nvme" in r.stderr, r.stderr[-2000:]
