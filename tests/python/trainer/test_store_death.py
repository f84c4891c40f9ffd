"""A dead offloadd-store ends the job with an error naming it, never a silent hang.
offloadd-train runs with the optimizer states on the NVMe tier; once it is training,
its offloadd-store child is SIGKILLed. The run must exit non-zero within a bound, saying that the
store died and how. Both clipping modes: with clipping the updates run in FinishStep (the path that
hung), without it they run as gradients arrive."""

import os
import pathlib
import signal
import subprocess
import time

import pytest

from pipeline_testlib import build_model, write_pretokenized

EXIT_BOUND_S = 30  # after the kill; a healthy step of this model takes milliseconds


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("store_death")
    return build_model(d / "model", layers=4), write_pretokenized(d / "data.jsonl", n=256)


def children(pid: int) -> list[int]:
    out = []
    for task in pathlib.Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def comm(pid: int) -> str:
    try:
        return pathlib.Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        return ""


@pytest.mark.parametrize("max_grad_norm", ["1.0", "0"])
def test_killed_store_fails_the_run_with_a_clear_error(binary_dir, job, tmp_path, max_grad_norm):
    model, data = job
    stderr_path = tmp_path / "stderr.txt"
    cmd = [str(binary_dir / "trainer" / "offloadd-train"), f"--model={model}", f"--data={data}",
           "--format=pretokenized", "--max-steps=100000", "--epochs=1000", "--workers=1x1",
           "--device=cpu", "--tier=nvme", f"--nvme-dir={tmp_path / 'nvme'}",
           f"--max-grad-norm={max_grad_norm}", f"--output-dir={tmp_path / 'out'}", "--no-export"]
    with open(stderr_path, "w") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            for line in p.stdout:  # training is under way once step 3 is reported
                if line.startswith("step 3/"):
                    break
            else:
                pytest.fail(f"offloadd-train ended before step 3:\n{stderr_path.read_text()}")
            stores = [c for c in children(p.pid) if comm(c) == "offloadd-store"]
            assert len(stores) == 1, [(c, comm(c)) for c in children(p.pid)]
            os.kill(stores[0], signal.SIGKILL)
            killed_at = time.monotonic()
            p.stdout.close()
            try:
                rc = p.wait(timeout=EXIT_BOUND_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"offloadd-train still running {EXIT_BOUND_S} s after its store was "
                            f"killed:\n{stderr_path.read_text()[-2000:]}")
            print(f"exited rc={rc} {time.monotonic() - killed_at:.2f} s after the kill")
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    stderr = stderr_path.read_text()
    print(stderr[-1000:])
    assert rc != 0
    assert "offloadd-store" in stderr and "killed by signal 9" in stderr, stderr[-2000:]
