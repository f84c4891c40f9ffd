"""Non-finite values in the weights end the job with an error naming them, never a hang: a
NaN in the model's safetensors (as a corrupt base model or checkpoint would bring)
makes every gradient NaN. With clipping the global gradient norm is NaN and the step must fail
saying so; without clipping the loss turns NaN and the step must fail saying that. With fp16 loss
scaling a non-finite norm is an overflow: the step is skipped as torch.amp.GradScaler does, and the
job goes on. Every run is bounded by a timeout: before the fix the clipped run hung for good in
the host optimizer's wait for the updated weights."""

import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline_testlib import build_model, read_stats, write_pretokenized

TIMEOUT_S = 60  # a three-step run on this model takes a few seconds


@pytest.fixture(scope="module")
def nan_job(tmp_path_factory):
    d = tmp_path_factory.mktemp("nan")
    model = build_model(d / "model")
    tensors = load_file(model / "model.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    tensors[name] = tensors[name].clone()
    tensors[name][3, 5] = float("nan")
    save_file(tensors, model / "model.safetensors", metadata={"format": "pt"})
    return model, write_pretokenized(d / "data.jsonl"), d


def train(binary_dir, model, data, out, *extra):
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
           "--format=pretokenized", "--max-steps=3", "--workers=1x1", "--device=cpu",
           f"--output-dir={out}", "--no-export", f"--stats-jsonl={out}.stats.jsonl", *extra]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"offloadd-train hung for {TIMEOUT_S} s on NaN weights ({' '.join(extra)});\n"
                    f"stderr tail:\n{(e.stderr or b'')[-2000:]!r}")


@pytest.mark.parametrize("tier", ["cpu", "nvme"])
def test_nan_weights_with_clipping_fail_naming_the_gradient_norm(binary_dir, nan_job, tmp_path, tier):
    model, data, _ = nan_job
    extra = ["--max-grad-norm=1.0", f"--tier={tier}"]
    if tier == "nvme":
        extra.append(f"--nvme-dir={tmp_path / 'nvme'}")
    r = train(binary_dir, model, data, tmp_path / "out", *extra)
    print(r.stderr[-1500:])
    assert r.returncode != 0
    assert "gradient norm is not finite" in r.stderr, r.stderr
    assert "step 1 was not applied" in r.stderr, r.stderr


def test_nan_weights_without_clipping_fail_naming_the_loss(binary_dir, nan_job, tmp_path):
    model, data, _ = nan_job
    r = train(binary_dir, model, data, tmp_path / "out", "--max-grad-norm=0")
    print(r.stderr[-1500:])
    assert r.returncode != 0
    assert "loss is not finite at step 1" in r.stderr, r.stderr


def test_nan_weights_with_fp16_loss_scaling_skip_steps(binary_dir, nan_job, tmp_path):
    """GradScaler semantics: inf/NaN gradients skip the step and back the scale off; the run ends
    (the losses stay NaN, but a skipped step is not an error)."""
    model, data, _ = nan_job
    out = tmp_path / "out"
    r = train(binary_dir, model, data, out, "--dtype=fp16", "--max-grad-norm=1.0")
    print(r.stderr[-1500:])
    assert r.returncode == 0, r.stderr
    stats = read_stats(out.with_name(out.name + ".stats.jsonl"))
    assert [s["skipped"] for s in stats] == [True, True, True], stats
    scales = [s["loss_scale"] for s in stats]
    assert scales[1] < scales[0] and scales[2] < scales[1], scales
