"""The step planner (job/step_planner.h, run through offloadd-plan) against an integer linear
program over per-block binaries, solved by HiGHS (scipy.optimize.milp), on the benchmark shapes.

The ILP is the planner's cost model written as OFFMATE writes its program: a binary per block for
"AdamW states on the GPU" (a prefix: y_b >= y_{b+1}) and per recomputed decoder layer for "kept",
a continuous T above every resource's time, the GPU budget as a knapsack row. The planner
enumerates (s, k) pairs instead; with alike decoder layers the two feasible sets give the same
times, so the planner's predicted step must equal the ILP optimum. With held updates (clipping
without speculation) one more row says T >= GPU backward - recompute saved + device AdamW + u, with
u above the GPU forward and above the CPU update's pool-rate and host-memory times. The planner breaks ties within
0.5% towards fewer kept layers, hence the bound: optimum <= planner <= 1.005 x optimum.

Inputs are representative H200 figures (bench/RESULTS.md: Llama-2-7B at 24 GiB, first-step peaks
and GPU times measured there; TinyLlama-1.1B at 6 GiB and Llama-2-70B at 80 GiB scaled from them by
flops and bytes); the node profile is the 112 GB/s host of the fifth session.
"""
from __future__ import annotations

import json
import subprocess
import time

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

GIB = 1 << 30
PROFILE = dict(host_bytes_per_s=112e9, cpu_params_per_s=4.15e9, h2d_bytes_per_s=52e9,
               d2h_bytes_per_s=52e9)
SHAPES = {  # name: hidden, layers, heads, kv heads, ffn, vocab
    "llama2-7b": (4096, 32, 32, 32, 11008, 32000),
    "tinyllama-1.1b": (2048, 22, 32, 4, 5632, 32000),
    "llama2-70b": (8192, 80, 64, 8, 28672, 32000),
}


def plan_inputs(shape, batch, budget_gib, peak_gib, gpu_seconds, seq=1024, held=False):
    h, layers, heads, kv, ff, vocab = SHAPES[shape]
    qd, kvd = h, h // heads * kv
    layer = 2 * h * qd + 2 * h * kvd + 3 * h * ff + 2 * h
    params = [vocab * h] + [layer] * layers + [h + vocab * h]
    tokens = batch * seq
    fwd_layer = 2 * tokens * h * (2 * qd + 2 * kvd + 3 * ff) + 2 * batch * heads * seq * seq * (h // heads)
    fwd_head = 6 * tokens * h * vocab
    work = 4 * fwd_layer * layers + fwd_head
    keep_extra = int(1.5 * tokens * 2 * (2 * h + 2 * qd + 2 * kvd + 2 * ff) + tokens * 4 * (2 + heads)
                     - 1.5 * tokens * h * 2)
    return dict(
        params=params,
        device_state_bytes=[14 * p for p in params],
        keep_extra_bytes=[0] + [keep_extra] * layers + [0],
        recompute_seconds=[0.0] + [gpu_seconds * fwd_layer / work] * layers + [0.0],
        budget_bytes=int(budget_gib * GIB), base_peak_bytes=int(peak_gib * GIB),
        gpu_seconds=gpu_seconds,
        h2d_bytes=2 * 4.0 * sum(params),  # fp32 masters streamed twice, cast on the GPU
        d2h_bytes=2.0 * sum(params),  # bf16 gradients
        # offloadd-plan's defaults (ApplyParamTraffic with no accumulation): the update's 26 B,
        # a placed block's two fp32 uploads and its bf16 gradients
        host_bytes_per_param=26.0, h2d_saved_per_param=8.0, d2h_saved_per_param=2.0,
        held_updates=held,
        gpu_forward_seconds=gpu_seconds * (fwd_layer * layers + fwd_head / 3) / work,
        **PROFILE)


# (shape, batch, budget GiB, first-step peak GiB, GPU s per step with every layer recomputed)
CASES = [
    ("llama2-7b", 4, 24, 7.5, 0.41),
    ("llama2-7b", 8, 24, 8.9, 0.80),
    ("llama2-7b", 16, 24, 12.2, 1.59),
    ("llama2-7b", 16, 40, 12.2, 1.59),  # room for kept layers: the GPU-bound side
    ("tinyllama-1.1b", 8, 6, 2.6, 0.10),
    ("tinyllama-1.1b", 32, 6, 4.9, 0.40),
    ("llama2-70b", 4, 80, 30.0, 4.3),
]


def ilp_optimum(inp):
    n = len(inp["params"])
    keepable = [b for b in range(n) if inp["keep_extra_bytes"][b] > 0]
    ny, nx = n, len(keepable)
    T = ny + nx  # index of the continuous variable
    U = T + 1  # held updates: the longer of the next forward and the CPU update
    nv = T + 2
    p = np.array(inp["params"], dtype=float)
    P = p.sum()
    rows, lo, hi = [], [], []

    def row(coef_y=None, coef_x=None, t=0.0, lb=-np.inf, ub=np.inf, u=0.0):
        r = np.zeros(nv)
        if coef_y is not None:
            r[:ny] = coef_y
        if coef_x is not None:
            r[ny:T] = coef_x
        r[T] = t
        r[U] = u
        rows.append(r)
        lo.append(lb)
        hi.append(ub)

    for b in range(n - 1):  # prefix: y_b - y_{b+1} >= 0
        c = np.zeros(ny)
        c[b], c[b + 1] = 1, -1
        row(coef_y=c, lb=0)
    room = inp["budget_bytes"] - inp["base_peak_bytes"] - inp.get("margin_bytes", 512 << 20)
    row(coef_y=np.array(inp["device_state_bytes"], float),
        coef_x=np.array([inp["keep_extra_bytes"][b] for b in keepable], float), ub=room)
    rec = np.array([inp["recompute_seconds"][b] for b in keepable])
    dev = 1e-11
    # T >= gpu - sum rec x + dev sum p y   <=>   T + rec.x - dev p.y >= gpu
    row(coef_y=-dev * p, coef_x=rec, t=1, lb=inp["gpu_seconds"])
    # T >= (P - p.y) / cpu   <=>   T + p.y / cpu >= P / cpu
    cpu = inp["cpu_params_per_s"]
    row(coef_y=p / cpu, t=1, lb=P / cpu)
    # host: ((P - p.y) hb + h2d - hs p.y + d2h - ds p.y) / bw
    bw = inp["host_bytes_per_s"]
    hb, hs, ds = inp["host_bytes_per_param"], inp["h2d_saved_per_param"], inp["d2h_saved_per_param"]
    row(coef_y=p * (hb + hs + ds) / bw, t=1, lb=(P * hb + inp["h2d_bytes"] + inp["d2h_bytes"]) / bw)
    row(coef_y=hs * p / inp["h2d_bytes_per_s"], t=1, lb=inp["h2d_bytes"] / inp["h2d_bytes_per_s"])
    row(coef_y=ds * p / inp["d2h_bytes_per_s"], t=1, lb=inp["d2h_bytes"] / inp["d2h_bytes_per_s"])
    if inp.get("held_updates"):
        fwd = inp["gpu_forward_seconds"]
        row(u=1, lb=fwd)  # u >= forward
        row(coef_y=p / cpu, u=1, lb=P / cpu)  # u >= (P - p.y) / cpu
        row(coef_y=p * hb / bw, u=1, lb=P * hb / bw)  # u >= (P - p.y) hb / bw
        # T >= backward - rec.x + dev p.y + u
        row(coef_y=-dev * p, coef_x=rec, t=1, u=-1, lb=inp["gpu_seconds"] - fwd)
    c = np.zeros(nv)
    c[T] = 1
    res = milp(c, constraints=LinearConstraint(np.array(rows), lo, hi),
               integrality=np.r_[np.ones(ny + nx), 0, 0],
               bounds=Bounds(0, np.r_[np.ones(ny + nx), np.inf, np.inf]))
    assert res.status == 0, res.message
    return res.fun, int(round(res.x[:ny].sum())), int(round(res.x[ny:T].sum()))


def run_plan(binary_dir, inp, tmp_path):
    f = tmp_path / "in.json"
    f.write_text(json.dumps(inp))
    t0 = time.monotonic()
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-plan"), str(f)], capture_output=True,
                       text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), r.stderr, elapsed


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("shape,batch,budget,peak,gpu", CASES)
def test_planner_reaches_the_ilp_optimum(binary_dir, tmp_path, shape, batch, budget, peak, gpu, held):
    inp = plan_inputs(shape, batch, budget, peak, gpu, held=held)
    plan, text, elapsed = run_plan(binary_dir, inp, tmp_path)
    opt, ilp_s, ilp_k = ilp_optimum(inp)
    print(f"{shape} b{batch} {budget} GiB: planner s={plan['device_blocks']} k={plan['keep_layers']} "
          f"{plan['predicted_s']:.4f} s ({plan['bound']}); ILP s={ilp_s} k={ilp_k} {opt:.4f} s; "
          f"{elapsed * 1e3:.0f} ms")
    assert opt * (1 - 1e-9) <= plan["predicted_s"] <= opt * 1.005 + 1e-12
    assert plan["gpu_bytes"] <= inp["budget_bytes"]
    assert elapsed < 5, "the plan must be solved in under 5 s"
    assert "predicted" in text


def test_gpu_bound_plans_keep_layers_and_host_bound_plans_place_states(binary_dir, tmp_path):
    """The two sides of the trade: with a fast host and a 40 GiB budget at batch 16 the GPU binds,
    so recomputes are dropped; on the 112 GB/s host at batch 8 host memory binds, so the budget
    holds AdamW states and no layer is kept (a kept layer would only use memory)."""
    fast = plan_inputs("llama2-7b", 16, 40, 12.2, 1.59)
    fast.update(host_bytes_per_s=400e9, cpu_params_per_s=20e9)
    plan, _, _ = run_plan(binary_dir, fast, tmp_path)
    assert plan["bound"] == "GPU" and plan["keep_layers"] > 0, plan
    slow, _, _ = run_plan(binary_dir, plan_inputs("llama2-7b", 8, 24, 8.9, 0.80), tmp_path)
    assert slow["bound"] == "host memory" and slow["keep_layers"] == 0 and slow["device_blocks"] > 0, slow


@pytest.mark.parametrize("patch,needle", [
    ({"params": [1, 2]}, "one entry per block"),
    ({"cpu_params_per_s": 0}, "cpu_params_per_s must be positive"),
    ({"budget_bytes": -1}, "budget_bytes must be positive"),
    ({"gpu_seconds": "fast"}, "field 'gpu_seconds'"),
    ({"fixed_device_blocks": 99}, "fixed_device_blocks exceeds the 34 blocks"),
])
def test_bad_inputs_are_refused_by_name(binary_dir, tmp_path, patch, needle):
    inp = plan_inputs("llama2-7b", 4, 24, 7.5, 0.41)
    inp.update(patch)
    f = tmp_path / "in.json"
    f.write_text(json.dumps(inp))
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-plan"), str(f)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and needle in r.stderr, r.stderr


def test_held_updates_price_the_backward_then_the_update(binary_dir, tmp_path):
    """Clipping without speculation: the step is at least the backward followed by the longer of
    the next forward and the CPU update (TinyLlama-1.1B batch 8 at 6 GiB on the H200 measured
    0.36 s against 0.16 s of GPU work and 0.24 s of CPU update; bench/RESULTS.md)."""
    inp = plan_inputs("tinyllama-1.1b", 8, 6, 5.9, 0.16, held=True)  # nothing fits beside it
    plan, text, _ = run_plan(binary_dir, inp, tmp_path)
    P = sum(inp["params"])
    update = max(P / inp["cpu_params_per_s"], inp["host_bytes_per_param"] * P / inp["host_bytes_per_s"])
    fwd = inp["gpu_forward_seconds"]
    assert plan["bound"] == "held updates", plan
    assert plan["held_s"] == pytest.approx(0.16 - fwd + max(fwd, update), rel=1e-12), plan
    assert "held updates" in text
    free = dict(inp, held_updates=False)
    unheld, _, _ = run_plan(binary_dir, free, tmp_path)
    assert unheld["held_s"] == 0 and unheld["predicted_s"] < plan["predicted_s"], unheld
    inp.update(gpu_forward_seconds=0.2)
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-plan"), "-"], input=json.dumps(inp),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "gpu_forward_seconds must be in [0, gpu_seconds]" in r.stderr, r.stderr


def test_the_update_runs_slower_while_the_copies_run(binary_dir, tmp_path):
    """With the AdamW rate during DMA profiled, the CPU update runs at it for as long as the
    longer PCIe direction copies, then at the rate alone (the H200 host measured 2.83 against
    4.62 G params/s alone at 15 threads)."""
    inp = plan_inputs("tinyllama-1.1b", 8, 6, 5.9, 0.16)  # nothing fits beside it: all on the CPU
    alone, _, _ = run_plan(binary_dir, inp, tmp_path)
    inp["cpu_params_per_s_during_dma"] = 0.6 * inp["cpu_params_per_s"]
    dma = max(inp["h2d_bytes"] / inp["h2d_bytes_per_s"], inp["d2h_bytes"] / inp["d2h_bytes_per_s"])
    P = sum(inp["params"])
    contended, _, _ = run_plan(binary_dir, inp, tmp_path)
    expected = dma + (P - inp["cpu_params_per_s_during_dma"] * dma) / inp["cpu_params_per_s"]
    assert contended["cpu_s"] == pytest.approx(expected, rel=1e-12), (contended, expected)
    assert contended["cpu_s"] > alone["cpu_s"] == pytest.approx(P / inp["cpu_params_per_s"], rel=1e-12)
    inp["cpu_params_per_s_during_dma"] = -1.0
    r = subprocess.run([str(binary_dir / "trainer" / "offloadd-plan"), "-"], input=json.dumps(inp),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "cpu_params_per_s_during_dma must be >= 0" in r.stderr, r.stderr


def test_nothing_fits_keeps_the_first_steps_plan(binary_dir, tmp_path):
    """A first step that already filled the budget leaves (0, 0): what it ran, never infeasible."""
    inp = plan_inputs("llama2-7b", 16, 24, 23.9, 1.59)
    plan, _, _ = run_plan(binary_dir, inp, tmp_path)
    assert plan["device_blocks"] == 0 and plan["keep_layers"] == 0, plan


def test_fixed_device_blocks_only_choose_the_kept_layers(binary_dir, tmp_path):
    """The re-fit after the plan check: states already on the GPU stay (fixed_device_blocks), and
    only the kept layers are chosen again, as the ILP with those binaries fixed would."""
    inp = plan_inputs("llama2-7b", 16, 40, 12.2, 1.59)
    inp.update(host_bytes_per_s=400e9, cpu_params_per_s=20e9, fixed_device_blocks=2)
    plan, _, _ = run_plan(binary_dir, inp, tmp_path)
    assert plan["device_blocks"] == 2 and plan["keep_layers"] > 0, plan
    free = dict(inp, fixed_device_blocks=-1)
    unfixed, _, _ = run_plan(binary_dir, free, tmp_path)
    assert unfixed["predicted_s"] <= plan["predicted_s"], (unfixed, plan)

