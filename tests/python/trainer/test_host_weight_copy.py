"""16-bit compute without a 16-bit weight copy in the host arena: the device reads the fp32 masters
and rounds them itself (14 bytes per parameter instead of 16). Training must be bit-identical to
the layout with the copy (--host-weight-copy): the same losses, gradient norms and final weights,
on the CPU (bf16 and fp16 with loss scaling, with and without accumulation) and, with a GPU, on
CUDA (resident and streamed weights). The cast itself: torch's fp32 -> bf16/fp16 rounding on the
CPU and on CUDA gives the host kernels' round-to-nearest-even bits, denormals included."""

import struct

import pytest
import torch
from safetensors.torch import load_file

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized

STEPS = 6


def args(model, data, out, *, dtype, accum, device="cpu", extra=()):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", f"--device={device}",
            f"--dtype={dtype}", "--batch-size=4", f"--grad-accum={accum}", f"--max-steps={STEPS}",
            "--lr=2e-3", "--weight-decay=0.1", "--max-grad-norm=0.5", "--scheduler=cosine",
            "--warmup-steps=2", "--seed=7", "--workers=1x2", "--speculate=never",
            f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl", *extra]


def train_both(binary_dir, tmp_path, *, dtype, accum, device="cpu", extra=()):
    model = build_model(tmp_path / "model", tied=accum == 1)
    data = write_pretokenized(tmp_path / "data.jsonl")
    outs = {}
    for name, flags in (("cast", []), ("copy", ["--host-weight-copy"])):
        out = tmp_path / name
        r = run_train(binary_dir, args(model, data, out, dtype=dtype, accum=accum, device=device,
                                       extra=[*extra, *flags]))
        outs[name] = (out, r.stderr)
    return outs


def assert_same_training(outs, accum):
    (cast, log_cast), (copy, log_copy) = outs["cast"], outs["copy"]
    acc = 4 if accum > 1 else 0  # the fp32 accumulation buffer
    assert f"({14 + acc} B/parameter, weights cast on the device" in log_cast, log_cast
    assert f"({16 + acc} B/parameter, weights 16-bit copy in RAM" in log_copy, log_copy
    a, b = read_stats(cast / "stats.jsonl"), read_stats(copy / "stats.jsonl")
    assert len(a) == STEPS
    for key in ("loss", "grad_norm"):
        assert [s[key] for s in a] == [s[key] for s in b], key
    wa, wb = load_file(cast / "model.safetensors"), load_file(copy / "model.safetensors")
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name


@pytest.mark.parametrize("dtype,accum", [("bf16", 2), ("bf16", 1), ("fp16", 1)])
def test_cpu_training_is_bit_identical_without_the_copy(binary_dir, tmp_path, dtype, accum):
    assert_same_training(train_both(binary_dir, tmp_path, dtype=dtype, accum=accum), accum)


def special_floats():
    """Denormals (either sign, around the rounding boundary), the smallest normal, ties and
    ordinary values: the inputs where a cast that flushes denormals or truncates would differ."""
    bits = [0x00000001, 0x00008000, 0x00018000, 0x00007fff, 0x007fffff, 0x80400000, 0x807f8000,
            0x00800000, 0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff, 0x33800000, 0x387fe000]
    g = torch.Generator().manual_seed(3)
    rand = torch.randint(0, 1 << 23, (4096,), generator=g, dtype=torch.int64)
    bits += [int(x) for x in rand]  # denormals
    bits += [0x3c000000 + int(x) for x in rand]  # normals around 2^-7
    raw = struct.pack(f"<{len(bits)}I", *bits)
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).clone()


def rne_bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """workers::internal::FloatToBf16 (the host kernels' rounding) for non-NaN x."""
    u = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF


def test_torch_cast_is_the_host_kernels_rounding():
    x = special_floats()
    got = x.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF
    assert torch.equal(got, rne_bf16_bits(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_cast_is_the_host_kernels_rounding():
    x = special_floats()
    for dt in (torch.bfloat16, torch.float16):
        want = x.to(dt).view(torch.int16)
        got = x.cuda().to(dt).cpu().view(torch.int16)
        assert torch.equal(got, want), dt
    got = x.cuda().to(torch.bfloat16).cpu().view(torch.int16).to(torch.int64) & 0xFFFF
    assert torch.equal(got, rne_bf16_bits(x))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("weights", ["resident", "stream"])
def test_cuda_training_is_bit_identical_without_the_copy(binary_dir, tmp_path, weights):
    outs = train_both(binary_dir, tmp_path, dtype="bf16", accum=2, device="cuda",
                      extra=[f"--weights={weights}", "--device-optimizer-blocks=0"])
    assert_same_training(outs, 2)


def test_nvme_tier_blocks_in_ram_keep_no_copy_and_train_the_same(binary_dir, tmp_path):
    # The NVMe tier under a host limit that keeps part of the blocks' states in RAM: those blocks
    # keep no 16-bit copy beside their masters (the device reads and rounds the masters), the NVMe
    # blocks keep theirs, and the run is bit-identical to the RAM tier and to the layout that keeps
    # every copy (--host-weight-copy). bf16 with accumulation 2, clipping every step.
    import json
    model = build_model(tmp_path / "model", tied=False)
    data = write_pretokenized(tmp_path / "data.jsonl")

    def nvme(limit, *flags):  # no limit named: every block's states on NVMe
        return ["--tier=nvme", f"--nvme-dir={tmp_path}/store-{len(flags)}-{limit}",
                *([f"--host-memory-limit={limit}"] if limit else []), *flags]

    def predicted(limit):
        out = tmp_path / "validate"
        r = run_train(binary_dir, args(model, data, out, dtype="bf16", accum=2,
                                       extra=[*nvme(limit), "--validate-only"]))
        return json.loads(r.stdout.splitlines()[1]), r.stdout
    all_nvme, _ = predicted(None)
    all_ram, _ = predicted(16 << 30)
    low, high = all_nvme["predicted_host_bytes"], all_ram["predicted_host_bytes"]
    assert high > low, (all_nvme, all_ram)
    limit = low + (high - low) * 3 // 4  # (the slots shrink as the largest block leaves NVMe)
    _, text = predicted(limit)
    assert "in RAM (" in text and "on NVMe (" in text, text  # a mixed placement
    runs = {"ram": [], "mixed": nvme(limit), "mixed copy": nvme(limit, "--host-weight-copy")}
    outs = {}
    for name, flags in runs.items():
        out = tmp_path / name.replace(" ", "-")
        r = run_train(binary_dir, args(model, data, out, dtype="bf16", accum=2, extra=flags))
        outs[name] = (out, r.stderr)
    log = outs["mixed"][1]
    assert "weights cast on the device from the fp32 masters of the blocks in RAM, a 16-bit copy of " \
           "the NVMe blocks'" in log, log
    assert "weights 16-bit copy in RAM" in outs["mixed copy"][1], outs["mixed copy"][1]
    ref = read_stats(outs["ram"][0] / "stats.jsonl")
    want = load_file(outs["ram"][0] / "model.safetensors")
    assert len(ref) == STEPS
    for name in ("mixed", "mixed copy"):
        got = read_stats(outs[name][0] / "stats.jsonl")
        for key in ("loss", "grad_norm"):
            assert [s[key] for s in got] == [s[key] for s in ref], (name, key)
        weights = load_file(outs[name][0] / "model.safetensors")
        assert weights.keys() == want.keys()
        for t in want:
            assert torch.equal(weights[t], want[t]), (name, t)
