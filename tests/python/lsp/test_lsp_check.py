"""LSP-Offload's compression and Adam in the subspace against dense PyTorch.

offloadd-lsp-check draws the d-sparse projectors, compresses each step's gradient (P^T G Q) and runs
the CPU workers' fused AdamW kernel on the subspace coordinates A; here the same projectors are
built densely from the dumped positions and values, and torch.optim.AdamW is applied to A with the
dense P^T G Q as its gradient.

Tolerances:
- compression: the d-sparse sums and the dense matmul add the same terms in different orders;
  rtol 1e-5 of the largest element (fp32, ~100 terms).
- AdamW on A: the kernel's own parity bound against torch.optim.AdamW (tests/python/workers:
  rtol 1e-6, atol 1e-9) on identical gradients; the gradients here differ by the compression's
  rounding above, so A is compared at rtol 1e-5 / atol 1e-8 (relative change of an Adam step to a
  1e-5 relative change of its gradient is at most 1e-5).
- identity projectors: the gradient passes through unchanged (bit-exact) and A equals the dense
  update of W (W = w0 + A) to one fp32 rounding per step of W's magnitude.
"""
import subprocess

import pytest
import torch
from safetensors.torch import load_file, save_file

import kernel_flavours


@pytest.fixture
def check(binary_dir):
    path = binary_dir / "lsp" / "offloadd-lsp-check"
    if not path.exists():
        pytest.fail(f"{path} not built (build target offloadd-lsp-check)")
    return path


def _run(check, tmp_path, w0, grads, *args):
    tensors = {"w0": w0.contiguous()}
    tensors.update({f"grad/{k}": g.contiguous() for k, g in enumerate(grads)})
    save_file(tensors, tmp_path / "in.safetensors")
    r = subprocess.run([str(check), "--in", str(tmp_path / "in.safetensors"), "--out",
                        str(tmp_path / "out.safetensors"), *map(str, args)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return load_file(tmp_path / "out.safetensors")


def _dense(index, values, cols):
    return torch.zeros(index.shape[0], cols).scatter_add_(1, index, values)


def _close(got, want, rtol, atol):
    err = (got.double() - want.double()).abs().max().item()
    assert err <= atol + rtol * want.abs().max().item(), f"max error {err}"


HP = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _hyper_args(hp):
    return ["--lr", hp["lr"], "--beta1", hp["betas"][0], "--beta2", hp["betas"][1], "--eps", hp["eps"],
            "--weight-decay", hp["weight_decay"]]


ARGS = _hyper_args(HP)


@pytest.mark.parametrize("kernel", kernel_flavours.params())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_subspace_adamw_matches_torch_on_compressed_gradients(check, tmp_path, dtype, kernel):
    gen = torch.Generator().manual_seed(0)
    m, n, s, d = 96, 160, 32, 4
    w0 = torch.randn(m, n, generator=gen)
    grads = [torch.randn(m, n, generator=gen).to(dtype) for _ in range(4)]
    out = _run(check, tmp_path, w0, grads, "--rank", s, "--nonzeros", d, "--seed", 7, "--kernel", kernel, *ARGS)
    P = _dense(out["p_index"], out["p_values"], s)
    Q = _dense(out["q_index"], out["q_values"], s)
    assert (P != 0).sum(1).eq(d).all() and (Q != 0).sum(1).eq(d).all()

    a = torch.nn.Parameter(torch.zeros(s, s))
    opt = torch.optim.AdamW([a], **HP)
    for k, g in enumerate(grads):
        c = P.t() @ g.float() @ Q
        _close(out[f"compressed/{k}"], c, 1e-5, 0)
        a.grad = c
        opt.step()
    st = opt.state[a]
    _close(out["a"], a.detach(), 1e-5, 1e-8)
    _close(out["exp_avg"], st["exp_avg"], 1e-5, 1e-8)
    _close(out["exp_avg_sq"], st["exp_avg_sq"], 1e-5, 1e-12)
    _close(out["w"], w0 + P @ a.detach() @ Q.t(), 1e-5, 1e-7)


def test_rank_and_nonzeros_are_clamped_to_the_shape(check, tmp_path):
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(8, 40, generator=gen)
    out = _run(check, tmp_path, w0, [torch.randn(8, 40, generator=gen)], "--rank", 512, "--nonzeros", 16, *ARGS)
    assert out["a"].shape == (8, 40)
    assert out["p_index"].shape == (8, 8) and out["q_index"].shape == (40, 16)


def test_identity_projectors_equal_dense_adamw(check, tmp_path):
    """s = the full dimensions with identity projectors: LSP is exact AdamW on W (no weight decay:
    in LSP mode decay acts on the subspace coordinates, lsp/README.md)."""
    gen = torch.Generator().manual_seed(2)
    w0 = torch.randn(24, 40, generator=gen)
    grads = [torch.randn(24, 40, generator=gen) for _ in range(5)]
    hp = dict(HP, weight_decay=0.0)
    out = _run(check, tmp_path, w0, grads, "--identity", *_hyper_args(hp))
    for k, g in enumerate(grads):
        assert torch.equal(out[f"compressed/{k}"], g)
    w = torch.nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([w], **hp)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    # Per step W rounds at its own magnitude (half an ulp, 2^-24 relative), A at its own; the
    # AdamW parity bound (rtol 1e-6) covers the kernel, 6 half-ulps of |W| the two accumulations.
    _close(out["w"], w.detach(), 1e-6 + 6 * 2.0 ** -24, 1e-9)


def test_bad_input_is_an_error_naming_it(check, tmp_path):
    save_file({"grad/0": torch.zeros(2, 2)}, tmp_path / "in.safetensors")
    r = subprocess.run([str(check), "--in", str(tmp_path / "in.safetensors"), "--out", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and '"w0"' in r.stderr
