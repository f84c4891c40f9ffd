"""The trainer's set-up before the first step.

- The first step of a run reports the time from the trainer's creation to it and the set-up's
  phases (StepStats::time_to_first_step_seconds, setup_phase_seconds; the daemon's
  offloadd_train_time_to_first_step_seconds and offloadd_train_setup_phase_seconds), and the plan
  log shows them; later steps do not carry them.
- The initial weights are read on several threads straight from the checkpoint's mapping (bf16, fp16
  and fp32 converted to the fp32 masters in pieces): exact, whatever the thread count, and the same
  whether the arena is populated first or in the background beside the fill (the phases' overlap
  itself is shown deterministically in tests/trainer/pipeline/arena_population_test.cc).
- The speculation policy in force is named in the plan log; the CPU default is never (bitwise).
"""

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline_testlib import build_model, read_stats, run_train, write_pretokenized

PHASES = ["cuda", "model", "data", "plan", "arena", "workers", "weights", "device"]


def base_args(model, data, out, *extra):
    out.mkdir(parents=True, exist_ok=True)
    return [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cpu", "--dtype=fp32",
            "--batch-size=4", "--workers=1x2", f"--output-dir={out}", f"--stats-jsonl={out}/stats.jsonl", *extra]


def covered_seconds(starts, seconds):
    """The wall time the intervals [start, start + seconds) cover together."""
    total, reach = 0.0, float("-inf")
    for b, e in sorted((s, s + d) for s, d in zip(starts, seconds)):
        total += max(0.0, e - max(b, reach))
        reach = max(reach, e)
    return total


def test_first_step_reports_the_time_to_it_by_phase(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=32)
    out = tmp_path / "out"
    r = run_train(binary_dir, base_args(model, data, out, "--max-steps=3", "--no-export"))
    stats = read_stats(out / "stats.jsonl")
    first = stats[0]
    assert first["time_to_first_step_seconds"] > 0
    phases = [first[f"setup_{p}_seconds"] for p in PHASES]
    starts = [first[f"setup_{p}_start_seconds"] for p in PHASES]
    assert all(p >= 0 for p in phases) and all(s >= 0 for s in starts), (phases, starts)
    # The phases are intervals of the set-up (they may overlap: the arena is populated beside the
    # weights), which is part of the time to the first step.
    assert all(s + p <= first["time_to_first_step_seconds"] + 1e-6 for s, p in zip(starts, phases))
    assert covered_seconds(starts, phases) <= first["time_to_first_step_seconds"] + 1e-6
    assert phases[PHASES.index("arena")] > 0 and phases[PHASES.index("weights")] > 0
    # Phases that run one after the other start in this order; the arena before the weights.
    order = ["model", "cuda", "plan", "data", "arena", "weights", "device"]
    assert [starts[PHASES.index(p)] for p in order] == sorted(starts[PHASES.index(p)] for p in order)
    assert all("time_to_first_step_seconds" not in s for s in stats[1:])
    setup = [line for line in r.stderr.splitlines() if "set-up " in line]
    assert len(setup) == 1, r.stderr
    assert all(f" {p} " in setup[0] for p in PHASES), setup[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_parallel_setup_reads_the_checkpoint_exactly(binary_dir, tmp_path, dtype):
    model = build_model(tmp_path / "model", layers=3)
    weights = {k: v.to(dtype).contiguous() for k, v in load_file(model / "model.safetensors").items()}
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    for threads in (1, 5):
        out = tmp_path / f"out{threads}"
        # lr 0: the one step changes nothing, so the export is the masters as read.
        run_train(binary_dir, base_args(model, data, out, "--max-steps=1", "--lr=0", f"--setup-threads={threads}"))
        exported = load_file(out / "model.safetensors")
        assert exported.keys() == weights.keys()
        for name, w in weights.items():
            assert exported[name].dtype == dtype, name
            assert torch.equal(exported[name], w), f"{name} with {threads} set-up threads"


def test_overlapped_setup_reads_the_same_masters_as_the_serial_one(binary_dir, tmp_path):
    """The arena populated in the background while the masters are filled (the default with more
    than one set-up thread) gives the masters of --no-setup-overlap and of one thread, bit for bit;
    the log says how the arena was populated and the stats carry each phase's interval."""
    model = build_model(tmp_path / "model", layers=3)
    weights = {k: v.to(torch.bfloat16).contiguous() for k, v in load_file(model / "model.safetensors").items()}
    save_file(weights, model / "model.safetensors", metadata={"format": "pt"})
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    exported, logs = {}, {}
    for name, extra in [("overlap", ["--setup-threads=4"]), ("serial", ["--setup-threads=4", "--no-setup-overlap"]),
                        ("one", ["--setup-threads=1"])]:
        out = tmp_path / name
        r = run_train(binary_dir, base_args(model, data, out, "--max-steps=1", "--lr=0", *extra))
        exported[name] = load_file(out / "model.safetensors")
        logs[name] = next(line for line in r.stderr.splitlines() if "set-up " in line)
        first = read_stats(out / "stats.jsonl")[0]
        arena = first["setup_arena_start_seconds"], first["setup_arena_seconds"]
        weights_start = first["setup_weights_start_seconds"]
        if name != "overlap":  # populated first, then read
            assert weights_start >= arena[0] + arena[1] - 1e-6, (name, first)
    for name in ("serial", "one"):
        for k, w in exported["overlap"].items():
            assert torch.equal(w, exported[name][k]), f"{k}: overlapped vs {name}"
            assert torch.equal(w, weights[k]), k
    assert "the arena populated in the background" in logs["overlap"], logs["overlap"]
    assert "background" not in logs["serial"] and "background" not in logs["one"], logs


def test_speculation_policy_is_named_in_the_plan(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)

    def plan(*extra):
        r = run_train(binary_dir, base_args(model, data, tmp_path / "out", "--max-steps=1", "--no-export", *extra))
        return next(line for line in r.stderr.splitlines() if "plan:" in line)

    assert "clipping at max_grad_norm 1, speculation never (the CPU default: bitwise reproducible)" in plan()
    explicit = plan("--speculate=auto")
    assert "speculation auto" in explicit and "default" not in explicit.split("speculation auto")[1].split(";")[0]
    assert "no clipping" in plan("--max-grad-norm=0")
    r = run_train(binary_dir, base_args(model, data, tmp_path / "out", "--max-steps=1", "--speculate=sometimes"),
                  check=False)
    assert r.returncode != 0 and "speculation must be auto, always or never, got 'sometimes'" in r.stderr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_speculation_default_on_a_gpu_is_auto(binary_dir, tmp_path):
    model = build_model(tmp_path / "model")
    data = write_pretokenized(tmp_path / "data.jsonl", n=16)
    out = tmp_path / "out"
    out.mkdir()
    r = run_train(binary_dir, [f"--model={model}", f"--data={data}", "--format=pretokenized", "--device=cuda",
                               "--batch-size=4", "--workers=1x2", "--max-steps=2", "--no-export",
                               f"--stats-jsonl={out}/stats.jsonl"])
    plan = next(line for line in r.stderr.splitlines() if "plan:" in line)
    assert "speculation auto (the GPU default" in plan, plan
