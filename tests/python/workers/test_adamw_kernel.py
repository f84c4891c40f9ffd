"""The fused AdamW kernel against torch.optim.AdamW, for every code path this CPU supports.

Tolerance: the kernel follows ATen's operation order (including its two fused multiply-adds, in
lerp and addcmul), so against torch.optim.AdamW(fused=True) the master weights, exp_avg and
exp_avg_sq are required to be bit-identical on every path (except in the last few elements,
where ATen's fused kernel switches to a scalar tail loop that does not fuse; there, and
everywhere, the tolerance below applies). Against the default single-tensor
AdamW (which rounds one intermediate differently in ~0.01% of elements) they must match with
rtol=1e-6, atol=1e-9 (measured: at most 1 ulp, max relative difference 1.1e-7). The bf16/fp16 weight copy must equal the kernel's own fp32 master
weights rounded by torch (.to(bfloat16)/.to(float16)), i.e. exactly round-to-nearest-even.
"""
import json

import pytest
import torch

RTOL, ATOL = 1e-6, 1e-9
N = 10_007  # not a multiple of any vector width: exercises the tails


def _write(path, tensor):
    path.write_bytes(tensor.contiguous().view(torch.uint8).numpy().tobytes())


def _read(path, dtype, n):
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype)[:n].clone()


def _run_kernel(tool, tmp_path, path, grad, state, hp, step, weight_dtype="bf16", grad_scale=None):
    gdt = "bf16" if grad.dtype == torch.bfloat16 else "fp32"
    _write(tmp_path / "g.bin", grad)
    for name in ("master", "exp_avg", "exp_avg_sq"):
        _write(tmp_path / f"{name}.bin", state[name])
    args = ["adamw", f"--path={path}", f"--n={grad.numel()}", f"--grad={tmp_path / 'g.bin'}",
            f"--grad-dtype={gdt}", f"--master={tmp_path / 'master.bin'}",
            f"--exp-avg={tmp_path / 'exp_avg.bin'}", f"--exp-avg-sq={tmp_path / 'exp_avg_sq.bin'}",
            f"--weights={tmp_path / 'w.bin'}", f"--weight-dtype={weight_dtype}",
            f"--lr={hp['lr']!r}", f"--beta1={hp['betas'][0]!r}", f"--beta2={hp['betas'][1]!r}",
            f"--eps={hp['eps']!r}", f"--weight-decay={hp['weight_decay']!r}", f"--step={step}"]
    if grad_scale is not None:
        args.append(f"--grad-scale={grad_scale!r}")
    out = json.loads(tool(*args).stdout)
    for name in ("master", "exp_avg", "exp_avg_sq"):
        state[name] = _read(tmp_path / f"{name}.bin", torch.float32, grad.numel())
    wdt = torch.bfloat16 if weight_dtype == "bf16" else torch.float16
    return out, _read(tmp_path / "w.bin", wdt, grad.numel())


@pytest.mark.parametrize("grad_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("fused", [False, True])
def test_matches_torch_adamw_every_path(tool, kernel_paths, tmp_path, grad_dtype, fused):
    gen = torch.Generator().manual_seed(1234)
    init = torch.randn(N, generator=gen)
    lrs = [1e-3, 7e-4, 3e-4, 2e-3]  # a schedule: lr changes every step
    hp = dict(betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    grads = [(torch.randn(N, generator=gen) * 10 ** torch.empty(N).uniform_(-4, 1, generator=gen))
             .to(grad_dtype) for _ in lrs]

    ref = torch.nn.Parameter(init.clone())
    opt = torch.optim.AdamW([ref], lr=lrs[0], fused=fused, **hp)
    for lr, g in zip(lrs, grads):
        for group in opt.param_groups:
            group["lr"] = lr
        ref.grad = g.float()
        opt.step()
    st = opt.state[ref]

    for path in kernel_paths:
        state = dict(master=init.clone(), exp_avg=torch.zeros(N), exp_avg_sq=torch.zeros(N))
        for k, (lr, g) in enumerate(zip(lrs, grads), start=1):
            out, w = _run_kernel(tool, tmp_path, path, g, state, dict(hp, lr=lr), k)
            assert out["path"] == path
            expected_sq = g.double().pow(2).sum().item()
            assert out["sq_norm"] == pytest.approx(expected_sq, rel=1e-5), path
        expected = dict(master=ref.detach(), exp_avg=st["exp_avg"], exp_avg_sq=st["exp_avg_sq"])
        for name, want in expected.items():
            torch.testing.assert_close(state[name], want, rtol=RTOL, atol=ATOL, msg=path)
            if fused:  # bit-identical, except ATen's own scalar tail (the last N % 64 elements)
                body = N - N % 64
                assert torch.equal(state[name][:body], want[:body]), (path, name)
        assert torch.equal(w, state["master"].to(torch.bfloat16)), path


def test_fp16_weights_and_grad_scale(tool, kernel_paths, tmp_path):
    gen = torch.Generator().manual_seed(7)
    init = torch.randn(N, generator=gen)
    g = torch.randn(N, generator=gen).to(torch.bfloat16)
    scale = 0.37
    hp = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    ref = torch.nn.Parameter(init.clone())
    opt = torch.optim.AdamW([ref], **hp)
    ref.grad = g.float() * torch.tensor(scale)  # what clip_grad_norm_ does: grad.mul_(clip_coef)
    opt.step()
    for path in kernel_paths:
        state = dict(master=init.clone(), exp_avg=torch.zeros(N), exp_avg_sq=torch.zeros(N))
        _, w = _run_kernel(tool, tmp_path, path, g, state, hp, 1, weight_dtype="fp16",
                           grad_scale=scale)
        torch.testing.assert_close(state["master"], ref.detach(), rtol=RTOL, atol=ATOL, msg=path)
        assert torch.equal(w, state["master"].to(torch.float16)), path


def test_beta1_at_or_above_half_uses_the_other_lerp_branch(tool, kernel_paths, tmp_path):
    gen = torch.Generator().manual_seed(3)
    init, g = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
    hp = dict(lr=1e-3, betas=(0.3, 0.99), eps=1e-8, weight_decay=0.0)
    ref = torch.nn.Parameter(init.clone())
    opt = torch.optim.AdamW([ref], **hp)
    ref.grad = g.clone()
    opt.step()
    for path in kernel_paths:
        state = dict(master=init.clone(), exp_avg=torch.zeros(N), exp_avg_sq=torch.zeros(N))
        _run_kernel(tool, tmp_path, path, g, state, hp, 1)
        torch.testing.assert_close(state["exp_avg"], opt.state[ref]["exp_avg"], rtol=RTOL,
                                   atol=ATOL, msg=path)
        torch.testing.assert_close(state["master"], ref.detach(), rtol=RTOL, atol=ATOL, msg=path)


def test_accumulate_and_norm(tool, kernel_paths, tmp_path):
    gen = torch.Generator().manual_seed(11)
    micro = [torch.randn(N, generator=gen).to(torch.bfloat16) for _ in range(3)]
    expected = micro[0].float() + micro[1].float() + micro[2].float()
    for path in kernel_paths:
        _write(tmp_path / "acc.bin", torch.full((N,), 123.0))  # garbage, overwritten by the first
        for i, g in enumerate(micro):
            _write(tmp_path / "g.bin", g)
            args = ["accumulate", f"--path={path}", f"--n={N}", f"--grad={tmp_path / 'g.bin'}",
                    "--grad-dtype=bf16", f"--acc={tmp_path / 'acc.bin'}"]
            out = json.loads(tool(*(args + (["--overwrite"] if i == 0 else []))).stdout)
            assert out["sq_norm"] == pytest.approx(g.double().pow(2).sum().item(), rel=1e-5)
        assert torch.equal(_read(tmp_path / "acc.bin", torch.float32, N), expected), path
        _write(tmp_path / "g.bin", expected)
        out = json.loads(tool("norm", f"--path={path}", f"--n={N}", f"--grad={tmp_path / 'g.bin'}",
                              "--grad-dtype=fp32").stdout)
        assert out["sq_norm"] == pytest.approx(expected.double().pow(2).sum().item(), rel=1e-5)


def test_bad_input_is_a_clear_error(tool, tmp_path):
    _write(tmp_path / "g.bin", torch.zeros(4))
    proc = tool("norm", "--n=100", f"--grad={tmp_path / 'g.bin'}", "--grad-dtype=fp32", check=False)
    assert proc.returncode == 1 and "fewer than" in proc.stderr
    proc = tool("norm", "--path=sse9", "--n=4", f"--grad={tmp_path / 'g.bin'}",
                "--grad-dtype=fp32", check=False)
    assert proc.returncode == 1 and "unknown kernel path" in proc.stderr
    for name in ("master", "exp_avg", "exp_avg_sq"):
        _write(tmp_path / f"{name}.bin", torch.zeros(4))
    proc = tool("adamw", "--n=4", f"--grad={tmp_path / 'g.bin'}", "--grad-dtype=fp32",
                f"--master={tmp_path / 'master.bin'}", f"--exp-avg={tmp_path / 'exp_avg.bin'}",
                f"--exp-avg-sq={tmp_path / 'exp_avg_sq.bin'}", "--lr=1e-3", "--beta1=1.5",
                "--beta2=0.9", "--eps=1e-8", "--weight-decay=0", "--step=1", check=False)
    assert proc.returncode == 1 and "beta1" in proc.stderr
