"""SIGKILL with the optimizer states split between RAM and NVMe (job/state_placement.h).

offloadd-train (CPU, fp32, clipping) runs with `--tier=nvme` under a named host memory limit that
holds some blocks' fp32 masters and AdamW moments in RAM and puts the rest in the NVMe store. Its
store is SIGKILLed mid-run (the run must fail naming the store), then the trainer process itself
(what an executor's death is to the job); each time the run resumes from its newest checkpoint
under another limit, so another placement. The final weights must equal an uninterrupted run's at
the first placement bit for bit, and so must a run with every block's states in RAM: the store's
versions and the checkpoints carry the states whichever tier held them.

The compact optimizer modes (int8 states, a bf16 master) keep their own bytes in the store: a store
SIGKILLed at a mixed placement, the run resumed at another, ends on the uninterrupted run's bits.

With the 16-bit weights on NVMe too (--param-tier=nvme, bf16 compute), the trainer reads every
block's weights from the store before each forward and backward: a store SIGKILLed under those
reads must fail the run naming the store, and the resume from its checkpoint must end on the
uninterrupted run's bits."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time

import pytest

from faultlib import build_model, differing_bytes, load_weights, write_pretokenized
from proc_tree import descendants_named  # noqa: E402 (on the path through faultlib)

STEPS = 12
SAVE_STEPS = 4
EXIT_BOUND_S = 60


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("placement_kills")
    return build_model(d / "model", layers=4), write_pretokenized(d / "data.jsonl", n=256)


def train_cmd(binary_dir, job, out: pathlib.Path, nvme: pathlib.Path, limit: int | None, *extra) -> list[str]:
    model, data = job
    return [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
            "--format=pretokenized", f"--max-steps={STEPS}", "--epochs=1000", "--workers=1x1", "--device=cpu",
            "--dtype=fp32", "--max-grad-norm=0.5", "--lr=3e-3", "--seed=7", "--grad-accum=2", "--batch-size=4",
            f"--save-steps={SAVE_STEPS}", "--tier=nvme", f"--nvme-dir={nvme}", f"--output-dir={out}",
            *([f"--host-memory-limit={limit}"] if limit else []), *extra]


def validate(binary_dir, job, tmp: pathlib.Path, limit: int | None) -> tuple[dict, str]:
    r = subprocess.run(train_cmd(binary_dir, job, tmp / "v-out", tmp / "v-nvme", limit, "--validate-only"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    line = next(l for l in r.stdout.splitlines() if l.startswith("{"))
    return json.loads(line), r.stdout


def placement(text: str) -> str:
    """'blocks 0-2 in RAM (...), 3-5 on NVMe (...)' from a run's output."""
    m = re.search(r"optimizer states (?:per block: |in RAM and NVMe: )"
                  r"(blocks [^()]* \([^)]*\)(?:, [^()]* on NVMe \([^)]*\))?)", text)
    return m.group(1) if m else "every block on NVMe"


def run_and_kill(cmd: list[str], log: pathlib.Path, at_step: int, victim: str) -> str:
    """Runs cmd until it reports step `at_step`, SIGKILLs `victim` ("store": its offloadd-store
    child; "trainer": the process itself) and returns its output; the run must end within the bound."""
    with open(log, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            for line in p.stdout:
                if line.startswith(f"step {at_step}/"):
                    break
            else:
                pytest.fail(f"the run ended before step {at_step}:\n{log.read_text()[-2000:]}")
            if victim == "store":
                stores = descendants_named(p.pid, "offloadd-store")
                assert len(stores) == 1, stores
                os.kill(stores[0], signal.SIGKILL)
            else:
                os.kill(p.pid, signal.SIGKILL)
            p.stdout.close()
            try:
                rc = p.wait(timeout=EXIT_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {EXIT_BOUND_S} s after its {victim} was killed:\n{log.read_text()[-2000:]}")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = log.read_text()
    assert rc != 0, text[-2000:]
    if victim == "store":
        assert "offloadd-store" in text and "killed by signal 9" in text, text[-2000:]
    return text


def newest_checkpoint(out: pathlib.Path) -> pathlib.Path:
    steps = sorted(int(p.name.split("-", 1)[1]) for p in out.glob("checkpoint-*") if p.name.split("-", 1)[1].isdigit())
    assert steps, f"no checkpoint in {out}"
    return out / f"checkpoint-{steps[-1]}"


@pytest.mark.timeout(300)
def test_kills_at_a_mixed_placement_and_resumes_at_others_bitwise(binary_dir, job, tmp_path):
    # All blocks' states on NVMe (no limit named), then with a limit large enough for all of them in
    # RAM: the difference is what the states add; limits between split them.
    nvme_all, _ = validate(binary_dir, job, tmp_path, None)
    ram_all, text = validate(binary_dir, job, tmp_path, 16 << 30)
    low, high = nvme_all["predicted_host_bytes"], ram_all["predicted_host_bytes"]
    assert high > low, (nvme_all, ram_all)
    # (high - low is every block's states less the staging slots they no longer need: each limit
    # holds a different number of whole blocks in RAM.)
    limits = [low + (high - low) * 3 // 4, low + (high - low) * 7 // 20]
    placements = [placement(validate(binary_dir, job, tmp_path, lim)[1]) for lim in limits]
    print("placements:", placements, "| all in RAM:", placement(text))
    for p in placements:
        assert "in RAM" in p and "on NVMe" in p, placements
    assert placements[0] != placements[1]

    ref_out = tmp_path / "ref"
    r = subprocess.run(train_cmd(binary_dir, job, ref_out, tmp_path / "ref-nvme", limits[0]),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert placement(r.stderr) == placements[0], r.stderr[-3000:]
    ref = load_weights(ref_out / "model.safetensors")
    # The placement does not change the result: every block's states in RAM (the RAM tier) trains
    # the same bits.
    ram_cmd = [a for a in train_cmd(binary_dir, job, tmp_path / "ram", tmp_path / "ram-nvme", None)
               if not a.startswith(("--tier=", "--nvme-dir="))]
    r = subprocess.run(ram_cmd, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    diff, total = differing_bytes(load_weights(tmp_path / "ram" / "model.safetensors"), ref)
    assert diff == 0, f"the RAM tier's weights differ from the mixed placement's in {diff} of {total} bytes"

    out = tmp_path / "out"
    # The store dies at step 6 (placement 0); the run resumes under limit 1, where its trainer is
    # killed at step 9; the last resume has every block on NVMe. Each run has its own store
    # directory: a resume starts from the checkpoint, whatever the store held.
    t0 = time.monotonic()
    run_and_kill(train_cmd(binary_dir, job, out, tmp_path / "nvme1", limits[0]), tmp_path / "run1.txt", 6, "store")
    resumed = newest_checkpoint(out)
    text = run_and_kill(train_cmd(binary_dir, job, out, tmp_path / "nvme2", limits[1], f"--resume-from={resumed}"),
                        tmp_path / "run2.txt", 9, "trainer")
    assert placement(text) == placements[1], text[-3000:]
    resumed = newest_checkpoint(out)
    r = subprocess.run(train_cmd(binary_dir, job, out, tmp_path / "nvme3", None, f"--resume-from={resumed}"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    print(f"kills and resumes: {time.monotonic() - t0:.1f} s; last resume from {resumed.name}")
    diff, total = differing_bytes(load_weights(out / "model.safetensors"), ref)
    assert diff == 0, f"final weights differ from the uninterrupted run in {diff} of {total} bytes"


@pytest.mark.timeout(300)
def test_store_killed_under_the_weight_reads_fails_naming_it_and_resumes_bitwise(binary_dir, job, tmp_path):
    def cmd(out: pathlib.Path, nvme: pathlib.Path, *extra) -> list[str]:
        c = train_cmd(binary_dir, job, out, nvme, None, "--param-tier=nvme", *extra)
        return [("--dtype=bf16" if a == "--dtype=fp32" else a) for a in c]

    ref_out = tmp_path / "ref"
    r = subprocess.run(cmd(ref_out, tmp_path / "ref-nvme"), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"16-bit weights of blocks 0-5 on NVMe", r.stderr), r.stderr[-3000:]
    ref = load_weights(ref_out / "model.safetensors")

    out = tmp_path / "out"
    # Every step reads each block's weights twice (forward, backward) while its states and new
    # weights are written back: the store dies under them.
    text = run_and_kill(cmd(out, tmp_path / "nvme1"), tmp_path / "run1.txt", 6, "store")
    resumed = newest_checkpoint(out)
    r = subprocess.run(cmd(out, tmp_path / "nvme2", f"--resume-from={resumed}"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    diff, total = differing_bytes(load_weights(out / "model.safetensors"), ref)
    assert diff == 0, f"final weights differ from the uninterrupted run in {diff} of {total} bytes"


@pytest.mark.timeout(300)
def test_store_killed_with_compact_states_on_nvme_resumes_bitwise(binary_dir, job, tmp_path):
    """int8 states with a bf16 master (bf16 compute): the store holds the NVMe blocks' int8 codes
    with their block scales and the bf16 master with its compensation. Killed mid-run at a mixed
    placement, the run resumes from its checkpoint at another placement and must end on the
    uninterrupted run's bits."""
    mode = ["--state-dtype=int8", "--master-dtype=bf16"]

    def cmd(out: pathlib.Path, nvme: pathlib.Path, limit: int | None, *extra) -> list[str]:
        c = train_cmd(binary_dir, job, out, nvme, limit, *mode, *extra)
        return [("--dtype=bf16" if a == "--dtype=fp32" else a) for a in c]

    def predicted(limit: int | None) -> tuple[int, str]:
        r = subprocess.run(cmd(tmp_path / "v-out", tmp_path / "v-nvme", limit, "--validate-only"),
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        line = next(l for l in r.stdout.splitlines() if l.startswith("{"))
        return json.loads(line)["predicted_host_bytes"], r.stdout

    low, high = predicted(None)[0], predicted(16 << 30)[0]
    assert high > low, (low, high)
    limits = [low + (high - low) * 3 // 4, low + (high - low) * 7 // 20]
    placements = [placement(predicted(lim)[1]) for lim in limits]
    print("placements:", placements)
    for p in placements:
        assert "in RAM" in p and "on NVMe" in p, placements

    ref_out = tmp_path / "ref"
    r = subprocess.run(cmd(ref_out, tmp_path / "ref-nvme", limits[0]), capture_output=True, text=True,
                       timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "optimizer not exact: bf16 master, int8 states" in r.stderr, r.stderr[-3000:]
    assert placement(r.stderr) == placements[0], r.stderr[-3000:]
    ref = load_weights(ref_out / "model.safetensors")

    out = tmp_path / "out"
    run_and_kill(cmd(out, tmp_path / "nvme1", limits[0]), tmp_path / "run1.txt", 6, "store")
    resumed = newest_checkpoint(out)
    r = subprocess.run(cmd(out, tmp_path / "nvme2", limits[1], f"--resume-from={resumed}"),
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert placement(r.stderr) == placements[1], r.stderr[-3000:]
    diff, total = differing_bytes(load_weights(out / "model.safetensors"), ref)
    assert diff == 0, f"final weights differ from the uninterrupted run in {diff} of {total} bytes"
