"""adamw_noise_testlib's error model (the k_eff of the bf16 parity bound, docs/parity_bounds.md)
on gradients whose answer follows from AdamW's arithmetic. With `draws` noise draws each
element's variance estimate has relative variance 2 / draws, which lowers the expected
participation ratio of n equal variances to n / (1 + 2 / draws)."""

import torch

from adamw_noise_testlib import error_variance

STEPS, DRAWS = 8, 128
LRS = [1e-3] * STEPS


def k_eff(v: torch.Tensor) -> float:
    return (v.sum() ** 2 / (v * v).sum()).item()


def test_equal_gradients_spread_the_error_over_every_element():
    g = [torch.ones(64)] * STEPS
    v = error_variance(g, [1e-2] * STEPS, LRS, weight_decay=0.1, draws=DRAWS)
    expect = 64 / (1 + 2 / DRAWS)
    assert 0.95 * expect <= k_eff(v) <= 64, f"k_eff {k_eff(v):.1f}, want ~{expect:.1f}"


def test_elements_whose_gradient_is_at_the_noise_level_carry_the_error():
    """8 of 64 elements have a gradient 100x below the noise (AdamW's update there is the noise's
    sign: steps of ~lr), the others 100x above it (their update moves by ~1e-2 of a step)."""
    g = torch.ones(64)
    g[:8] = 1e-4
    v = error_variance([g] * STEPS, [1e-2] * STEPS, LRS, draws=DRAWS)
    assert v[8:].max() < 1e-3 * v[:8].min()
    expect = 8 / (1 + 2 / DRAWS)
    assert 0.9 * expect <= k_eff(v) <= 8.1, f"k_eff {k_eff(v):.2f}, want ~{expect:.2f}"


def test_elements_without_a_gradient_get_no_error():
    """An embedding row no token reached is exactly zero in both runs: no noise, no error."""
    g = torch.ones(16)
    g[4:] = 0
    v = error_variance([g] * STEPS, [1e-2] * STEPS, LRS, draws=DRAWS)
    assert torch.all(v[4:] == 0) and torch.all(v[:4] > 0)
