"""Helpers for the engine parity tests: tiny transformers models saved to tmp dirs and a runner
for the C++ offloadd-engine-check tool."""
import os
import pathlib
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

BINARY_DIR = pathlib.Path(os.environ.get("OFFLOADD_BINARY_DIR", "build"))
SOURCE_DIR = pathlib.Path(os.environ.get("OFFLOADD_SOURCE_DIR", pathlib.Path(__file__).parents[3]))
CHECK = BINARY_DIR / "engine" / "offloadd-engine-check"


def need_check_binary():
    if CHECK.exists():
        return
    msg = f"{CHECK} not built (build target offloadd-engine-check)"
    if "OFFLOADD_BINARY_DIR" in os.environ:  # under CTest the build must provide it
        pytest.fail(msg)
    pytest.skip(msg)


def run_check(model_dir, inputs, out, *extra, expect_ok=True):
    """Runs the tool; returns the dumped tensors (or the CompletedProcess when expect_ok=False)."""
    need_check_binary()
    cmd = [str(CHECK), "--model", str(model_dir), "--out", str(out)]
    if inputs is not None:
        cmd += ["--inputs", str(inputs)]
    cmd += [str(x) for x in extra]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if not expect_ok:
        return proc
    assert proc.returncode == 0, f"{' '.join(cmd)}\nstdout:{proc.stdout}\nstderr:{proc.stderr}"
    return load_file(str(out))


def write_inputs(path, input_ids, labels=None, position_ids=None):
    t = {"input_ids": input_ids.contiguous()}
    if labels is not None:
        t["labels"] = labels.contiguous()
    if position_ids is not None:
        t["position_ids"] = position_ids.contiguous()
    save_file(t, str(path))


def make_batch(vocab, batch=4, seq=12, seed=0, prompt=3):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    labels = ids.clone()
    labels[:, :prompt] = -100  # prompt masking: these positions are not trained
    labels[1, 7:] = -100       # a row with a shorter completion
    return ids, labels


def hf_reference(model, ids, labels, position_ids=None):
    """fp32 logits, loss and every parameter gradient from transformers (eval: no dropout)."""
    model.eval()
    model.zero_grad()
    out = model(input_ids=ids, labels=labels, position_ids=position_ids)
    out.loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    return out.logits.detach(), out.loss.detach(), grads
