"""Exact global-norm clipping and micro-batch accumulation through the real worker pool.

offloadd-optim-tool `train` runs a layered model through WorkerPool + StepDriver: gradients
arrive layer by layer in backward order (last layer first), accumulate over micro-batches in
fp32, and with max_grad_norm set the updates are held until the global norm is known ("hold"
mode, workers/README.md). The result is compared with PyTorch's
    backward per micro-batch (fp32 +=); clip_grad_norm_(params, max_grad_norm); AdamW.step()

Tolerances, and why:
  * Global norm: within NORM_RTOL = 1e-6 of the exact (float64) norm. PyTorch's own fp32 norm
    is ~1.5e-6 off the exact value on these inputs, so against clip_grad_norm_'s return value
    we allow NORM_VS_TORCH_RTOL = 5e-6.
  * The clip coefficient therefore differs from PyTorch's in the last bits, so against the real
    clip_grad_norm_ + AdamW run the state must agree norm-wise: max|ours - torch| <=
    STATE_VS_TORCH = 1e-5 * max|torch| (exp_avg has elements near zero from cancellation, where
    an element-wise relative test would measure the coefficient, not the update).
  * With PyTorch given our coefficient instead (grads.mul_(coef) then AdamW), everything else
    being PyTorch, the state must match element-wise with the kernel tolerance rtol=1e-6,
    atol=1e-9: the mechanism (hold, scale, accumulate, update) adds no error of its own.
"""
import json
import math

import pytest
import torch

LAYERS = [5_000, 12_289, 777, 20_000]
RTOL, ATOL = 1e-6, 1e-9
NORM_RTOL, NORM_VS_TORCH_RTOL = 1e-6, 5e-6
STATE_VS_TORCH = 1e-5


def _scenario(tmp_path, *, steps, micro, max_grad_norm, grad_scales, processes=2, threads=2):
    gen = torch.Generator().manual_seed(2024)
    (tmp_path / "init").mkdir()
    (tmp_path / "grads").mkdir()
    init = [torch.randn(n, generator=gen) for n in LAYERS]
    for l, t in enumerate(init):
        (tmp_path / "init" / f"L{l}.bin").write_bytes(t.numpy().tobytes())
    grads = {}
    for s in range(1, steps + 1):
        for m in range(micro):
            for l, n in enumerate(LAYERS):
                g = (torch.randn(n, generator=gen) * grad_scales[s - 1]).to(torch.bfloat16)
                grads[s, m, l] = g
                (tmp_path / "grads" / f"s{s}_m{m}_L{l}.bin").write_bytes(
                    g.view(torch.int16).numpy().tobytes())
    hp = dict(lr=[1e-3, 5e-4, 2e-3, 1e-3][:steps], beta1=0.9, beta2=0.95, eps=1e-8,
              weight_decay=0.1)
    spec = dict(layers=LAYERS, steps=steps, micro_batches=micro, max_grad_norm=max_grad_norm,
                processes=processes, threads=threads, **hp)
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    return init, grads, hp


def _torch_reference(init, grads, hp, *, steps, micro, max_grad_norm, coefs=None):
    params = [torch.nn.Parameter(t.clone()) for t in init]
    opt = torch.optim.AdamW(params, lr=hp["lr"][0], betas=(hp["beta1"], hp["beta2"]),
                            eps=hp["eps"], weight_decay=hp["weight_decay"])
    norms = []
    for s in range(1, steps + 1):
        for l, p in enumerate(params):
            p.grad = None
            for m in range(micro):  # what autograd does across micro-batches: fp32 +=
                g = grads[s, m, l].float()
                p.grad = g.clone() if p.grad is None else p.grad + g
        if coefs is not None:  # PyTorch with our clip coefficient
            for p in params:
                p.grad.mul_(torch.tensor(coefs[s - 1], dtype=torch.float32))
        elif max_grad_norm > 0:
            norms.append(torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item())
        else:
            norms.append(torch.linalg.vector_norm(
                torch.stack([torch.linalg.vector_norm(p.grad) for p in params])).item())
        opt.param_groups[0]["lr"] = hp["lr"][s - 1]
        opt.step()
    return params, opt, norms


def _read(path, dtype):
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=dtype)


@pytest.mark.parametrize("micro", [1, 3])
@pytest.mark.parametrize("max_grad_norm", [0.0, 1.0])
def test_pool_equals_clip_grad_norm_and_adamw(tool, tmp_path, micro, max_grad_norm):
    steps = 3
    # Step 2's gradients are small enough that clipping does not trigger; 1 and 3 clip hard.
    scales = [0.05, 0.001, 0.2]
    init, grads, hp = _scenario(tmp_path, steps=steps, micro=micro, max_grad_norm=max_grad_norm,
                                grad_scales=scales)
    out = json.loads(tool("train", f"--spec={tmp_path / 'spec.json'}").stdout)
    params, opt, norms = _torch_reference(init, grads, hp, steps=steps, micro=micro,
                                          max_grad_norm=max_grad_norm)
    coefs = [r["clip_coef"] for r in out["steps"]]
    if max_grad_norm > 0:
        assert coefs[0] < 1 and coefs[1] == 1 and coefs[2] < 1, coefs  # both regimes exercised
    else:
        assert coefs == [1, 1, 1]
    for s, (got, want) in enumerate(zip(out["steps"], norms), start=1):
        exact = math.sqrt(sum(sum(grads[s, m, l].double() for m in range(micro)).pow(2).sum().item()
                              for l in range(len(LAYERS))))
        assert got["grad_norm"] == pytest.approx(exact, rel=NORM_RTOL)
        assert got["grad_norm"] == pytest.approx(want, rel=NORM_VS_TORCH_RTOL)
        assert got["params_updated"] == sum(LAYERS)
    for l, p in enumerate(params):
        st = opt.state[p]
        for name, want in (("master", p.detach()), ("exp_avg", st["exp_avg"]),
                           ("exp_avg_sq", st["exp_avg_sq"])):
            got = _read(tmp_path / "out" / f"L{l}.{name}.bin", torch.float32)
            bound = STATE_VS_TORCH * want.abs().max().item()
            assert (got - want).abs().max().item() <= bound, (l, name)
    # Same run, PyTorch applying our coefficient: element-wise kernel tolerance.
    params, opt, _ = _torch_reference(init, grads, hp, steps=steps, micro=micro,
                                      max_grad_norm=max_grad_norm, coefs=coefs)
    for l, p in enumerate(params):
        st = opt.state[p]
        master = _read(tmp_path / "out" / f"L{l}.master.bin", torch.float32)
        torch.testing.assert_close(master, p.detach(), rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(_read(tmp_path / "out" / f"L{l}.exp_avg.bin", torch.float32),
                                   st["exp_avg"], rtol=RTOL, atol=ATOL)
        torch.testing.assert_close(_read(tmp_path / "out" / f"L{l}.exp_avg_sq.bin", torch.float32),
                                   st["exp_avg_sq"], rtol=RTOL, atol=ATOL)
        weights = _read(tmp_path / "out" / f"L{l}.weights.bin", torch.bfloat16)
        assert torch.equal(weights, master.to(torch.bfloat16))


def test_bad_spec_is_a_clear_error(tool, tmp_path):
    (tmp_path / "spec.json").write_text(json.dumps({"layers": [10], "steps": 2, "lr": [1e-3]}))
    proc = tool("train", f"--spec={tmp_path / 'spec.json'}", check=False)
    assert proc.returncode == 1
    assert "beta1" in proc.stderr or "lr needs one value per step" in proc.stderr
