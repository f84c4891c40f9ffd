"""How many elements of a tensor carry a 16-bit training's weight error after a few AdamW steps:
the effective element count k_eff of the bf16 parity bound 1.25 + 4 / sqrt(k_eff), computed from
the float64 run's own gradients (docs/parity_bounds.md derives it; test_families_gpu.py and
bench/engine/qk_bias_parity.py use it).

The error model: at each step s every element of a tensor's gradient carries independent noise
of one standard deviation sigma_s (the tensor's rms bf16 gradient error at that step, measured on
transformers' bf16 run against the float64 one: the yardstick's own noise, never the engine's).
AdamW, run exactly on the float64 gradients with and without that noise, turns it into each
element's weight error; its variance v_i is estimated from `draws` noise draws, and
k_eff = (sum_i v_i)^2 / sum_i v_i^2, the participation ratio of the variances (the
Satterthwaite degrees of freedom of |e|^2 = sum_i e_i^2)."""

import torch

from families_testlib import state_as_checkpoint


class GradientRecorder:
    """Records, per parameter name, every optimizer step's gradient as AdamW sees it (after
    clipping) and the step's learning rate. With `against` (the float64 run's recorder) it keeps
    only each step's rms difference from that run's gradient: the noise level sigma_s."""

    def __init__(self, against: "GradientRecorder | None" = None):
        self.against = against
        self.grads, self.noise, self.lrs = {}, {}, []
        self.betas, self.eps, self.weight_decay = (0.9, 0.999), 1e-8, 0.0

    def attach(self, opt, model) -> None:
        names = {p: n for n, p in model.named_parameters()}
        group = opt.param_groups[0]
        self.betas, self.eps, self.weight_decay = group["betas"], group["eps"], group["weight_decay"]

        def hook(o, args, kwargs):
            step = len(self.lrs)
            self.lrs.append(o.param_groups[0]["lr"])
            for p, n in names.items():
                if p.grad is None:
                    continue
                g = p.grad.detach()
                if self.against is None:
                    self.grads.setdefault(n, []).append(g.float().cpu().clone())
                else:
                    exact = self.against.grads[n][step].to(g.device, torch.float64)
                    on = exact != 0  # rows no token reached are exactly zero in both runs
                    rms = (g.double() - exact)[on].pow(2).mean().sqrt().item() if on.any() else 0.0
                    self.noise.setdefault(n, []).append(rms)
        opt.register_step_pre_hook(hook)


def _adamw_weights(g, lrs, betas, eps, weight_decay):
    """AdamW's weight change over the steps from gradients g[t] (elementwise, any shape)."""
    b1, b2 = betas
    m = v = w = torch.zeros_like(g[0])
    for t in range(g.shape[0]):
        m = b1 * m + (1 - b1) * g[t]
        v = b2 * v + (1 - b2) * g[t] * g[t]
        u = (m / (1 - b1 ** (t + 1))) / ((v / (1 - b2 ** (t + 1))).sqrt() + eps)
        w = w * (1 - lrs[t] * weight_decay) - lrs[t] * u
    return w


def error_variance(exact: list, noise: list, lrs: list, betas=(0.9, 0.999), eps=1e-8,
                   weight_decay=0.0, draws: int = 128, device="cpu") -> torch.Tensor:
    """Each element's expected squared weight error (flattened): AdamW on the exact per-step
    gradients plus N(0, noise[s]^2) per element and step, against AdamW on the exact ones. An
    element whose exact gradient is zero at a step (an embedding row no token of the step
    reached) gets no noise there: both runs' gradients are exactly zero."""
    g = torch.stack([x.to(device, torch.float64).flatten() for x in exact])
    sigma = torch.tensor(noise, dtype=torch.float64, device=device).view(-1, 1, 1)
    gen = torch.Generator(device=device).manual_seed(0)
    out = torch.empty(g.shape[1], dtype=torch.float64, device=device)
    chunk = max(1, (1 << 22) // draws)
    for lo in range(0, g.shape[1], chunk):
        gc = g[:, lo:lo + chunk].unsqueeze(1)
        clean = _adamw_weights(gc, lrs, betas, eps, weight_decay)
        z = torch.randn((gc.shape[0], draws, gc.shape[2]), dtype=torch.float64, device=device,
                        generator=gen)
        noisy = _adamw_weights(gc + sigma * z * (gc != 0), lrs, betas, eps, weight_decay)
        out[lo:lo + chunk] = ((noisy - clean) ** 2).mean(0)
    return out


def effective_count(truth: GradientRecorder, low: GradientRecorder, name: str,
                    device="cpu") -> float:
    """k_eff of tensor `name`: the participation ratio of its elements' error variances. A tensor
    without noise (no gradient error anywhere) counts all its elements."""
    exact = truth.grads[name]
    v = error_variance(exact, low.noise[name], truth.lrs, truth.betas, truth.eps,
                       truth.weight_decay, device=device)
    if v.sum() == 0:
        return float(v.numel())
    return (v.sum() ** 2 / (v * v).sum()).item()


def bound(k_eff: float) -> float:
    """The per-tensor bound on |w_off - w64| / |w_hf - w64| (docs/parity_bounds.md)."""
    return 1.25 + 4 / k_eff ** 0.5


def effective_counts_as_checkpoint(model, truth: GradientRecorder, low: GradientRecorder, tmp,
                                   device="cpu") -> dict:
    """{checkpoint tensor name: k_eff}: each parameter's k_eff under the names save_pretrained
    writes (its key mapping, e.g. Gemma 3's language_model.*); `model`'s parameters are
    overwritten. A parameter without a gradient (a vision tower) counts all its elements."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            k = effective_count(truth, low, name, device) if name in truth.grads else p.numel()
            p.fill_(k)
    return {n: t.flatten()[0].item() for n, t in state_as_checkpoint(model, tmp).items()}
