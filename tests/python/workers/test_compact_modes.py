"""The compact optimizer modes (workers/adamw_compact.h, `offloadd-optim-tool compact`) against
torch.optim.AdamW, on the fastest flavour this CPU supports and the portable one.

From zero states the first step's update uses the fresh fp32 moments, not their stored form, so
the masters after it are torch's to fp32 rounding in every state format; the stored moments then
differ from torch's by their format's rounding: bf16 (stochastic) less than one bf16 ulp (2^-7 of
the value), int8 half a quantisation step of the block (absmax(m) / 127; max(sqrt(v)) / 255 on
sqrt(v), a whole step where sqrt(v) is below one). Later steps start from the stored moments; the
C++ tests (tests/workers/adamw_compact_test.cc) check those against a float64 reference of the
quantised algorithm.
"""
import numpy as np
import pytest
import torch

N = 1000  # three whole blocks of 256 and a partial one
BLOCK = 256
HP = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
WIDTH = {"fp32": 4, "bf16": 2, "int8": 1}


def _bf16(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _step(tool, tmp_path, flavour, state, master, grad, files, step):
    args = ["compact", f"--path={flavour}", f"--n={N}", "--grad-dtype=fp32", f"--grad={tmp_path / 'g.bin'}",
            f"--state-dtype={state}", f"--master-dtype={master}", f"--lr={HP['lr']}", f"--beta1={HP['betas'][0]}",
            f"--beta2={HP['betas'][1]}", f"--eps={HP['eps']}", f"--weight-decay={HP['weight_decay']}",
            f"--step={step}"]
    grad.numpy().astype(np.float32).tofile(tmp_path / "g.bin")
    tool(*args, *[f"--{k}={v}" for k, v in files.items()])


def _files(tmp_path, state, master, p0):
    files = {k: tmp_path / f"{k}.bin" for k in ("master", "exp-avg", "exp-avg-sq")}
    if master == "fp32":
        p0.astype(np.float32).tofile(files["master"])
    else:
        u = p0.astype(np.float32).view(np.uint32).astype(np.uint64)
        hi = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
        hi.tofile(files["master"])
        files["master-comp"] = tmp_path / "master-comp.bin"
        np.zeros(N, np.uint16).tofile(files["master-comp"])  # p0 is bf16-exact
    for k in ("exp-avg", "exp-avg-sq"):
        np.zeros(N * WIDTH[state], np.uint8).tofile(files[k])
    if state == "int8":
        for k in ("exp-avg-scale", "exp-avg-sq-scale"):
            files[k] = tmp_path / f"{k}.bin"
            np.zeros(-(-N // BLOCK), np.float32).tofile(files[k])
    return files


def _decode(files, state, master):
    if master == "fp32":
        p = np.fromfile(files["master"], np.float32).astype(np.float64)
    else:
        p = _bf16(np.fromfile(files["master"], np.uint16)) + _bf16(np.fromfile(files["master-comp"], np.uint16))
    if state == "fp32":
        m = np.fromfile(files["exp-avg"], np.float32).astype(np.float64)
        sv = np.sqrt(np.fromfile(files["exp-avg-sq"], np.float32).astype(np.float64))
    elif state == "bf16":
        m = _bf16(np.fromfile(files["exp-avg"], np.uint16))
        sv = np.sqrt(_bf16(np.fromfile(files["exp-avg-sq"], np.uint16)))
    else:
        ms = np.repeat(np.fromfile(files["exp-avg-scale"], np.float32).astype(np.float64), BLOCK)[:N]
        vs = np.repeat(np.fromfile(files["exp-avg-sq-scale"], np.float32).astype(np.float64), BLOCK)[:N]
        m = np.fromfile(files["exp-avg"], np.int8) * ms / 127
        sv = np.fromfile(files["exp-avg-sq"], np.uint8) * vs / 255
    return p, m, sv


def _block_max(x):
    pad = np.zeros(-(-N // BLOCK) * BLOCK)
    pad[:N] = np.abs(x)
    return np.repeat(pad.reshape(-1, BLOCK).max(axis=1), BLOCK)[:N]


@pytest.mark.parametrize("state", ["fp32", "bf16", "int8"])
@pytest.mark.parametrize("master", ["fp32", "bf16"])
def test_first_step_is_torch_adamw_and_states_within_their_format(tool, kernel_paths, tmp_path, state, master):
    g = torch.Generator().manual_seed(5)
    scale = 2.0 ** torch.randint(-12, -4, (N,), generator=g)  # octaves apart within each block
    p0 = (torch.randn(N, generator=g) * 0.05).to(torch.bfloat16).double()  # exact in a bf16 master
    grad = torch.randn(N, generator=g, dtype=torch.float64) * scale
    ref = p0.float().clone().requires_grad_(True)
    opt = torch.optim.AdamW([ref], **HP)
    ref.grad = grad.float()
    opt.step()
    want_p = ref.detach().double().numpy()
    want_m = opt.state[ref]["exp_avg"].double().numpy()
    want_sv = np.sqrt(opt.state[ref]["exp_avg_sq"].double().numpy())
    lr_step = HP["lr"]  # the first step: lr * m_hat / (sqrt(v_hat) + eps), m_hat / sqrt(v_hat) = +-1
    # The fastest flavour and the portable one (every flavour gives the portable bits:
    # AdamWCompactTest.EveryFlavourMatchesPortableBitForBit).
    for flavour in sorted({kernel_paths[0], "portable"}):
        files = _files(tmp_path, state, master, p0.numpy())
        _step(tool, tmp_path, flavour, state, master, grad.float(), files, 1)
        p, m, sv = _decode(files, state, master)
        # fp32 roundings of the master and of the update (2^-22 each), and for the bf16 master the
        # compensation's rounding (2^-18 of the master).
        p_tol = 2.0 ** -22 * (np.abs(want_p) + lr_step) + (2.0 ** -17 * np.abs(want_p) if master == "bf16" else 0)
        np.testing.assert_array_less(np.abs(p - want_p), p_tol + 1e-30, err_msg=f"{flavour} master")
        m_tol, sv_tol = 2.0 ** -22 * np.abs(want_m), 2.0 ** -22 * want_sv
        if state == "bf16":
            m_tol, sv_tol = m_tol + 2.0 ** -7 * np.abs(want_m), sv_tol + 2.0 ** -8 * want_sv
        elif state == "int8":
            m_step, sv_step = _block_max(want_m) / 127, _block_max(want_sv) / 255
            m_tol = m_tol + 0.5 * m_step * (1 + 2.0 ** -20)
            sv_tol = sv_tol + np.where(want_sv < sv_step, 1.0, 0.5) * sv_step * (1 + 2.0 ** -20)
        np.testing.assert_array_less(np.abs(m - want_m), m_tol + 1e-30, err_msg=f"{flavour} exp_avg")
        np.testing.assert_array_less(np.abs(sv - want_sv), sv_tol + 1e-30, err_msg=f"{flavour} sqrt(exp_avg_sq)")


def test_unknown_modes_are_refused_by_name(tool, tmp_path):
    np.zeros(N, np.float32).tofile(tmp_path / "g.bin")
    r = tool("compact", f"--n={N}", "--grad-dtype=fp32", f"--grad={tmp_path / 'g.bin'}", "--state-dtype=int4",
             "--lr=1e-3", "--beta1=0.9", "--beta2=0.999", "--eps=1e-8", "--weight-decay=0", "--step=1", check=False)
    assert r.returncode != 0 and "optimizer.state_dtype: unknown value 'int4'" in r.stderr, r.stderr
