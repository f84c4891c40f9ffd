"""LSP-Offload mode in the trainer (trainer/pipeline/lsp_mode.h, lsp/README.md), on the
CPU device.

- Identity projectors (s = the full dimensions) with no weight decay: LSP training is exact AdamW
  on W = W_base + A, so the run must match PyTorch's clip_grad_norm_ + AdamW within the all-CPU
  parity bounds (test_pipeline_parity.py: loss <= 1e-5 per step, weights <= 2e-5). W_base + A
  rounds differently from an updated W by at most one half-ulp per step (20 steps x 6e-8 at |w| ~ 1),
  well inside them.
- Learned projectors: a resumed run continues the same loss curve bit for bit (projectors, W_base
  and the subspace states are checkpointed exactly), and the exported weights equal
  W_base + P A Q^T computed densely from the checkpoint's parts (fp32 rounding of d*d terms).
- The same with the embedding's AdamW states on the device (device_optimizer_blocks 1).
- Bad specs and unsupported combinations are refused naming what is wrong.
"""
import json

import pytest
import torch
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, reference_train, run_train, write_pretokenized
from test_pipeline_parity import COMMON, STEPS, train_args

LEARNED = "--compression=lsp:rank=8,nonzeros=2,check_every=5,threshold=0.5,learn_steps=20"


def _dense(index, values, cols):
    return torch.zeros(index.shape[0], cols).scatter_add_(1, index, values)


# device_optimizer_blocks 1: the embedding (exact) keeps its AdamW states on the device, the
# decoder layers' subspaces stay with the CPU workers.
@pytest.mark.parametrize("device_blocks", [0, 1])
def test_identity_projectors_equal_exact_adamw(binary_dir, tmp_path, device_blocks):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    out = tmp_path / "out"
    args = [a for a in train_args(model, data, out, accum=2) if not a.startswith("--weight-decay")]
    r = run_train(binary_dir, args + ["--weight-decay=0", "--compression=lsp:projectors=identity",
                                      f"--device-optimizer-blocks={device_blocks}"])
    assert "LSP-Offload on 14 decoder-layer matrices (identity projectors" in r.stderr, r.stderr[-2000:]
    assert ("AdamW states of blocks 0-0 on the device" in r.stderr) == (device_blocks == 1), r.stderr[-2000:]
    assert "projector check" not in r.stderr  # identity projectors are never re-learned
    stats = read_stats(out / "stats.jsonl")
    ref_losses, ref_state = reference_train(model, json.loads((out / "batches.json").read_text()),
                                            **{**COMMON, "weight_decay": 0.0})
    for step, (a, b) in enumerate(zip((s["loss"] for s in stats), ref_losses), 1):
        assert abs(a - b) <= 1e-5, f"step {step}: offloadd {a} vs PyTorch {b}"
    assert sum(s["grad_norm"] > COMMON["max_grad_norm"] for s in stats) >= STEPS // 2  # it clips
    # Compression is timed on its own track; on the CPU the weights are rebuilt by the optimizer
    # thread after each update, so there is no materialisation inside the step's compute.
    assert all(s["lsp_compress_seconds"] > 0 and s["lsp_decompress_seconds"] == 0 for s in stats), stats
    exported = load_file(out / "model.safetensors")
    for name, ref in ref_state.items():
        diff = (exported[name] - ref).abs().max().item()
        assert diff <= 2e-5, f"{name}: max |diff| {diff}"


def test_learned_projectors_resume_exactly_and_export_the_subspace_weights(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    full, resumed, at6 = tmp_path / "full", tmp_path / "resumed", tmp_path / "at6"
    r = run_train(binary_dir, train_args(model, data, full, accum=1) +
                  [LEARNED, "--save-steps=6", f"--trace={full}/trace.json"])
    # The LSP work has its own spans: checks (step loop), compressions (in the backward) and
    # decompressions (the optimizer thread, overlapping the backward of lower blocks).
    trace = json.loads((full / "trace.json").read_text())
    names = {e["name"].split(" ")[0] for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {"projector", "compress", "decompress"} <= names, sorted(names)
    checks = [line for line in r.stderr.splitlines() if "LSP projector check before step" in line]
    assert [c.split("before step ")[1].split(":")[0] for c in checks] == ["1", "6", "11", "16"], checks
    assert all("switched to learned projectors" in c for c in checks)
    a = read_stats(full / "stats.jsonl")
    assert len(a) == STEPS and all(s["loss"] == s["loss"] for s in a)  # finite

    ckpt = full / "checkpoint-6"
    run_train(binary_dir, train_args(model, data, resumed, accum=1) + [LEARNED, f"--resume-from={ckpt}"])
    b = read_stats(resumed / "stats.jsonl")
    assert [s["step"] for s in b] == list(range(7, STEPS + 1))
    assert [(s["loss"], s["grad_norm"]) for s in a[6:]] == [(s["loss"], s["grad_norm"]) for s in b]
    wa, wb = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name

    # Resuming checkpoint-6 with nothing left to run exports its weights: W_base + P A Q^T.
    args = [x for x in train_args(model, data, at6, accum=1) if not x.startswith("--max-steps")]
    run_train(binary_dir, args + ["--max-steps=6", LEARNED, f"--resume-from={ckpt}"])
    exported = load_file(at6 / "model.safetensors")
    state = load_file(ckpt / "lsp_state.safetensors")
    layer1 = load_file(ckpt / "model-layer-00001.safetensors")
    name = "model.layers.0.mlp.up_proj.weight"
    m, n, sm, sn = state[name + ".shape"].tolist()
    P = _dense(state[name + ".p_index"], state[name + ".p_values"], sm)
    Q = _dense(state[name + ".q_index"], state[name + ".q_values"], sn)
    A = layer1[name + ".lsp_a"]
    assert A.shape == (sm, sn) == (8, 8) and A.abs().max() > 0
    want = state[name + ".base"] + P @ A @ Q.t()
    assert (exported[name] - want).abs().max().item() <= 1e-6 * want.abs().max().item() + 1e-7
    # Exact parameters (norms, embedding, head) are checkpointed as themselves.
    assert layer1["model.layers.0.input_layernorm.weight"].shape == (32,)


def test_checkpoints_do_not_cross_modes(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    lsp_out, exact_out = tmp_path / "lsp", tmp_path / "exact"
    run_train(binary_dir, train_args(model, data, lsp_out, accum=1) + [LEARNED, "--save-steps=10"])
    r = run_train(binary_dir, train_args(model, data, exact_out, accum=1) +
                  [f"--resume-from={lsp_out}/checkpoint-10"], check=False)
    assert r.returncode != 0 and 'the checkpoint is of model "llama+lsp/' in r.stderr, r.stderr[-1500:]
    assert 'this job\'s model is "llama/' in r.stderr
    # An LSP checkpoint without its projectors and W_base cannot resume: the error names the file,
    # and the checkpoint itself is left as it was.
    ckpt = lsp_out / "checkpoint-10"
    (ckpt / "lsp_state.safetensors").unlink()
    before = sorted(p.name for p in ckpt.iterdir())
    r = run_train(binary_dir, train_args(model, data, tmp_path / "again", accum=1) +
                  [LEARNED, f"--resume-from={ckpt}"], check=False)
    assert r.returncode != 0 and "lsp_state.safetensors" in r.stderr, r.stderr[-1500:]
    assert sorted(p.name for p in ckpt.iterdir()) == before


@pytest.mark.parametrize("spec,message", [
    ("lsp:rank=0", "rank must be at least 1"),
    ("lsp:nonzeros=x", "nonzeros must be an integer"),
    ("lsp:threshold=-1", "threshold must be a finite number >= 0"),
    ("lsp:foo=1", "unknown key 'foo'"),
    ("lsp:rank", "'rank' is not key=value"),
    ("lossy", "compression must be none or lsp"),
    ("lsp:projectors=dense", "projectors must be learned or identity"),
])
def test_bad_specs_are_refused_naming_the_key(binary_dir, tmp_path, spec, message):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    r = run_train(binary_dir, train_args(model, data, tmp_path / "out", accum=1) + [f"--compression={spec}"],
                  check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-1500:]


@pytest.mark.parametrize("extra,message", [
    (["--device=cuda"], "LSP compression on CUDA computes in bf16"),  # train_args ask for fp32
    (["--batch-size=auto"], "does not price LSP compression"),
    (["--device-optimizer-blocks=2"], "only the lowest 1 block(s), exact (no compressed weight)"),
])
def test_unsupported_combinations_are_refused(binary_dir, tmp_path, extra, message):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    r = run_train(binary_dir, train_args(model, data, tmp_path / "out", accum=1) + [LEARNED] + extra,
                  check=False)
    assert r.returncode != 0 and message in r.stderr, r.stderr[-1500:]


def test_the_gemm_form_of_the_projector_check_equals_the_sparse_passes(binary_dir, tmp_path):
    """The GPU's form of the residual ||P P^T G Q Q^T - G||^2 (GEMMs through C = P^T G Q; forced
    on the CPU with OFFLOADD_LSP_DENSE=1) against the sparse passes the CPU uses: the check's mean
    bias agrees to 1e-4 relative (fp32 rounding of two summation orders over ~1e3 terms), and so do
    the learned projectors' biases to 1e-3 (20 Adam steps carry that rounding)."""
    import os
    import subprocess
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl")
    found = {}
    for dense in ("0", "1"):
        out = tmp_path / f"dense{dense}"
        cmd = [str(binary_dir / "trainer" / "offloadd-train"), *train_args(model, data, out, accum=1), LEARNED,
               "--max-steps=2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "OFFLOADD_LSP_DENSE": dense})
        assert r.returncode == 0, r.stderr[-2000:]
        check = next(s for s in read_stats(out / "stats.jsonl", steps_only=False) if "lsp_checked" in s)
        found[dense] = (check["lsp_mean_bias"], check["lsp_checked"], check["lsp_switched"],
                        check["lsp_mean_bias_after"])
    (b0, n0, s0, a0), (b1, n1, s1, a1) = found["0"], found["1"]
    assert (n0, s0) == (n1, s1) and s0 > 0, found
    assert abs(b0 - b1) <= 1e-4 * b0, found
    assert abs(a0 - a1) <= 1e-3 * a0, found
