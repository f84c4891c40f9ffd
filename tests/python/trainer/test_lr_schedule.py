"""The native learning-rate schedules equal transformers.get_scheduler step by step (the schedule
the HF Trainer builds from TrainingArguments). Tolerance: 1e-12 absolute on the multiplier."""

from __future__ import annotations

import math
import subprocess

import pytest
import torch
from transformers import get_scheduler


def reference(kind: str, warmup_steps: int, warmup_ratio: float, total: int) -> list[float]:
    warmup = warmup_steps if warmup_steps > 0 else math.ceil(warmup_ratio * total)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(kind, optimizer=opt, num_warmup_steps=warmup, num_training_steps=total)
    out = []
    for _ in range(total):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("kind", ["linear", "cosine", "constant", "constant_with_warmup"])
@pytest.mark.parametrize("warmup_steps,warmup_ratio,total", [(0, 0.0, 17), (5, 0.0, 40), (0, 0.1, 25), (3, 0.0, 3)])
def test_matches_transformers(binary_dir, kind, warmup_steps, warmup_ratio, total):
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-lr-schedule"), kind, str(warmup_steps),
                        str(warmup_ratio), str(total)], capture_output=True, text=True, check=True)
    ours = [float(x) for x in r.stdout.split()]
    ref = reference(kind, warmup_steps, warmup_ratio, total)
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        assert a == pytest.approx(b, abs=1e-12), f"update {k}: {a} vs {b}"


def test_unknown_schedule_is_a_clear_error(binary_dir):
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-lr-schedule"), "exponential", "0", "0", "10"],
                       capture_output=True, text=True)
    assert r.returncode == 1 and "lr_scheduler_type 'exponential' is not supported" in r.stderr


@pytest.mark.parametrize("kind,num_cycles,kwargs", [
    ("cosine", 1.5, {"num_cycles": 1.5}),
    ("cosine_with_min_lr", 0.5, {"min_lr_rate": 0.1}),
    ("cosine_with_min_lr", 2.0, {"num_cycles": 2.0, "min_lr_rate": 0.25}),
    ("cosine_with_min_lr", 0.5, {"min_lr": 0.05}),  # lr 1.0: min_lr is the rate
])
def test_scheduler_kwargs_match_transformers(binary_dir, kind, num_cycles, kwargs):
    """lr_scheduler_kwargs (num_cycles, min_lr / min_lr_rate) as transformers' get_scheduler
    takes them through scheduler_specific_kwargs."""
    warmup, total = 4, 30
    min_lr_rate = kwargs.get("min_lr_rate", kwargs.get("min_lr", 0.0))
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-lr-schedule"), kind, str(warmup), "0", str(total),
                        str(num_cycles), str(min_lr_rate)], capture_output=True, text=True, check=True)
    ours = [float(x) for x in r.stdout.split()]
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = get_scheduler(kind, optimizer=opt, num_warmup_steps=warmup, num_training_steps=total,
                          scheduler_specific_kwargs=kwargs)
    ref = []
    for _ in range(total):
        ref.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert ours == pytest.approx(ref, abs=1e-12)
    if kind == "cosine_with_min_lr":
        assert min(ours[warmup:]) == pytest.approx(min_lr_rate, abs=0.02)
