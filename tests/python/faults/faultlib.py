"""Helpers for the fault suite: a daemon whose config, environment and storage directory the test
chooses, the tiny job every test trains, event watching that survives a daemon crash, process
lookups (children by name, VmRSS, open fds) and the bit-for-bit comparison of final weights."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "daemon"))
sys.path.insert(0, str(HERE.parent / "trainer"))
from pipeline_testlib import build_model, write_pretokenized  # noqa: E402,F401

import offloadd  # noqa: E402
from offloadd.v1 import job_pb2  # noqa: E402
from proc_tree import descendants_named  # noqa: E402

S = job_pb2
FULL = os.environ.get("OFFLOADD_FAULTS_FULL", "") not in ("", "0")
SEED = int(os.environ.get("OFFLOADD_FAULTS_SEED", "18"))
GRACE_S = 5


def state_name(state: int) -> str:
    return S.JobState.Name(state)


class FaultDaemon:
    """offloadd on a temp Unix socket, ready when it says READY=1 on NOTIFY_SOCKET (as
    tests/python/daemon/daemon_process.py), with the state directory, the store's directory and
    the environment (LD_PRELOAD shims) chosen by the test. Restartable on the same directories:
    each start keeps the previous log as offloadd.log.<n>."""

    def __init__(self, binary: pathlib.Path, workdir: pathlib.Path, *, state_dir: pathlib.Path | None = None,
                 store_dir: pathlib.Path | None = None, roots: list[pathlib.Path] | None = None,
                 env: dict | None = None, extra_yaml: str = ""):
        self.binary = binary
        self.workdir = workdir
        self.state_dir = state_dir or workdir / "state"
        self.store_dir = store_dir or workdir / "nvme"
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.socket_path = workdir / "run" / "offloadd.sock"
        self.config_path = workdir / "offloadd.yaml"
        self.log_path = workdir / "offloadd.log"
        self.env = env or {}
        roots = roots or [workdir]
        self.config_path.write_text(textwrap.dedent(f"""\
            state_dir: {self.state_dir}
            allowed_roots: [{", ".join(str(r) for r in roots)}]
            server:
              unix_socket: {self.socket_path}
              unix_socket_mode: "0600"
              shutdown_grace_seconds: {GRACE_S}
            metrics:
              listen: 127.0.0.1:0
            storage:
              directories:
                - path: {self.store_dir}
            """) + extra_yaml)
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def target(self) -> str:
        return f"unix://{self.socket_path}"

    def start(self, timeout: float = 30) -> "FaultDaemon":
        notify_path = str(self.workdir / "notify.sock")
        if os.path.exists(notify_path):
            os.unlink(notify_path)
        if self.log_path.exists():
            n = 1
            while self.log_path.with_name(f"{self.log_path.name}.{n}").exists():
                n += 1
            self.log_path.rename(self.log_path.with_name(f"{self.log_path.name}.{n}"))
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.settimeout(timeout)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, **self.env)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(self.binary), "--config", str(self.config_path)], stdout=self._log,
                                     stderr=subprocess.STDOUT, env=env)
        self.starts += 1
        notify.settimeout(0.2)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if "READY=1" in notify.recv(4096).decode():
                        break
                except socket.timeout:
                    if self.proc.poll() is not None:
                        self._log.close()
                        raise AssertionError(f"offloadd exited with {self.proc.returncode} before it was ready:\n"
                                             f"{self.log()[-3000:]}")
                    if time.monotonic() > deadline:
                        self.stop()
                        raise AssertionError(f"offloadd did not become ready in {timeout}s:\n{self.log()[-3000:]}")
        finally:
            notify.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def all_logs(self) -> str:
        parts = sorted(self.workdir.glob("offloadd.log.*"), key=lambda p: int(p.suffix[1:]))
        return "".join(p.read_text(errors="replace") for p in parts) + self.log()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        """SIGKILLs the daemon and returns once the processes it started are gone too. They die by
        their death signals, in a chain (daemon -> executor -> worker/store): a
        test that opens what they held (a store's LOCK) must not race the chain's last link."""
        below = [p for name in ("offloadd-executor", "offloadd-worker", "offloadd-store")
                 for p in descendants_named(self.proc.pid, name)]
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._log.close()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in below):
            assert time.monotonic() < deadline, f"processes of the killed daemon still alive: {below}"
            time.sleep(0.02)  # no event tells a process's end to a non-parent

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=GRACE_S + 10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if getattr(self, "_log", None):
            self._log.close()

    def children(self, name: str) -> list[int]:
        return children_named(self.proc.pid, name)

    def rss_kib(self) -> int:
        return vm_rss_kib(self.proc.pid)

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))


children_named = descendants_named  # the helpers are the executor's children now


def _alive(pid: int) -> bool:
    """Whether `pid` still runs (a zombie, dead but not reaped by its new parent, does not)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def vm_rss_kib(pid: int) -> int:
    m = re.search(r"VmRSS:\s+(\d+) kB", pathlib.Path(f"/proc/{pid}/status").read_text())
    return int(m.group(1)) if m else 0


def spec(ws: pathlib.Path, out: str, *, steps: int, save_steps: int, accum: int = 4, nvme: bool = True,
         resume_from: str = "", model: str = "model", data: str = "data.jsonl") -> dict:
    s = {
        "display_name": out,
        "model": {"path": str(ws / model), "compute_dtype": "fp32"},
        "dataset": {"paths": [str(ws / data)], "format": "pretokenized", "max_seq_length": 64},
        "training": {"learning_rate": 3e-3, "per_device_train_batch_size": 4, "max_steps": steps,
                     "gradient_accumulation_steps": accum, "warmup_steps": 2, "lr_scheduler_type": "cosine",
                     "weight_decay": 0.1, "max_grad_norm": 0.5, "seed": 7, "logging_steps": 1,
                     "save_steps": save_steps},
        "output_dir": str(ws / out),
    }
    if nvme:
        s["offload"] = {"offload_optimizer": {"device": "nvme"}}
    if resume_from:
        s["resume_from_checkpoint"] = resume_from
    return s


class Events:
    """A job's events from one WatchJob stream, collected on a thread; the stream just ends when
    the daemon dies."""

    def __init__(self, client: offloadd.Client, job_id: str, after_cursor: int = 0):
        self.events: list = []
        self.error: Exception | None = None
        self.cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, args=(client, job_id, after_cursor), daemon=True)
        self._thread.start()

    def _run(self, client, job_id, after_cursor):
        try:
            for e in client.watch_job(job_id, after_cursor=after_cursor):
                with self.cond:
                    self.events.append(e)
                    self.cond.notify_all()
        except offloadd.OffloaddError as e:
            self.error = e
        finally:
            with self.cond:
                self.cond.notify_all()

    @property
    def ended(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = 30) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the watch stream did not end"

    def wait_for(self, pred, timeout: float):
        """The first event matching pred, or None when the stream ends or the time is up."""
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for e in self.events:
                    if pred(e):
                        return e
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    return None
                self.cond.wait(min(left, 0.5))

    def last_cursor(self) -> int:
        with self.cond:
            return self.events[-1].cursor if self.events else 0

    def last_step(self) -> int:
        with self.cond:
            steps = [e.progress.step for e in self.events if e.HasField("progress")]
        return steps[-1] if steps else 0

    def last_kind(self) -> str:
        with self.cond:
            if not self.events:
                return "-"
            e = self.events[-1]
        kind = e.WhichOneof("event")
        if kind == "progress":
            return f"step {e.progress.step} reported"
        if kind == "checkpoint_saved":
            return f"checkpoint-{e.checkpoint_saved.step} saved"
        if kind == "log":
            return "log: " + e.log.message[:40]
        if kind == "state_change":
            return state_name(e.state_change.state)
        return kind or "-"


def logs(events) -> list[str]:
    return [e.log.message for e in events if e.HasField("log")]


def load_weights(path: pathlib.Path) -> dict:
    from safetensors.numpy import load_file

    return load_file(str(path))


def differing_bytes(a: dict, b: dict) -> tuple[int, int]:
    """(bytes that differ, total bytes) between two state dicts; a tensor missing on one side or
    of another shape counts whole."""
    import numpy as np

    diff = total = 0
    for k in sorted(set(a) | set(b)):
        x, y = a.get(k), b.get(k)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            diff += (x if x is not None else y).nbytes
            total += (x if x is not None else y).nbytes
            continue
        xb = np.frombuffer(x.tobytes(), np.uint8)
        yb = np.frombuffer(y.tobytes(), np.uint8)
        diff += int((xb != yb).sum())
        total += xb.size
    return diff, total


def wait_final(client: offloadd.Client, job_id: str, timeout: float) -> S.Job:
    """The job once it is SUCCEEDED, FAILED or CANCELLED; the job as it stands after `timeout`
    otherwise (the caller names the hang)."""
    try:
        return client.wait(job_id, timeout=timeout)
    except offloadd.WaitTimeout:
        return client.get_job(job_id)


def build_fault_shim(out_dir: pathlib.Path) -> pathlib.Path:
    """fault_shim.c compiled into <out_dir>/fault_shim.so (the LD_PRELOAD shim that fails writes
    and syncs under a prefix while an arm file exists); skips the test without a C compiler."""
    import shutil

    import pytest

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not cc:
        pytest.skip("no C compiler for the LD_PRELOAD fault shim")
    out = out_dir / "fault_shim.so"
    r = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(out), str(HERE / "fault_shim.c"), "-ldl"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return out


class Hold:
    """Stops a job at a known point while the test acts, with fault_shim.c preloaded: the thread
    that renames something to `name` (a checkpoint's commit: "checkpoint-4") waits, once the
    rename is done, until release(). The job can then not move on behind the test's back, as it
    could between an event and the test's reaction to it on a loaded machine.

    hold = Hold(dir, "checkpoint-4", shim); FaultDaemon(..., env=hold.env); hold.wait(bound)
    blocks until a process reached the point; act; hold.release()."""

    def __init__(self, directory: pathlib.Path, name: str, shim: pathlib.Path):
        directory.mkdir(parents=True, exist_ok=True)
        self.held_path, self.release_path = directory / "held", directory / "release"
        for p in (self.held_path, self.release_path):
            p.unlink(missing_ok=True)
            os.mkfifo(p)
        self.name = name
        # Open before any process can reach the point: the shim's non-blocking open finds a reader.
        self._held = os.open(self.held_path, os.O_RDONLY | os.O_NONBLOCK)
        self.env = {"LD_PRELOAD": str(shim), "OFFLOADD_FAULT_HOLD_NAME": name,
                    "OFFLOADD_FAULT_HOLD_DIR": str(directory)}

    def wait(self, timeout: float, what: str = "") -> None:
        """Returns once a process is held at the point; AssertionError after `timeout` s."""
        import select

        p = select.poll()
        p.register(self._held, select.POLLIN)
        assert p.poll(timeout * 1000), f"nothing renamed to {self.name} within {timeout} s{what}"
        assert os.read(self._held, 1) == b"h"

    def release(self) -> None:
        """Lets the held thread go (its process may have been killed meanwhile: nothing to do)."""
        try:
            fd = os.open(self.release_path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:  # ENXIO: no reader left, the held process is gone
            return
        os.write(fd, b"r")
        os.close(fd)

    def close(self) -> None:
        if self._held >= 0:
            os.close(self._held)
            self._held = -1


def wait_until(pred, timeout: float, what: str):
    """pred()'s first true value within `timeout` s (polled every 0.1 s: health and the log have
    no change notification to wait on); AssertionError naming `what` after it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {what}")


def make_assets(root: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The suite's tiny Llama (2 layers, hidden 32) and 64 pretokenized documents."""
    return build_model(root / "model", layers=2), write_pretokenized(root / "data.jsonl", n=64)


def make_workspace(root: pathlib.Path, assets) -> pathlib.Path:
    """A directory holding copies of the assets (the daemon's allowed root in most tests)."""
    import shutil

    model, data = assets
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(model, root / "model")
    shutil.copy(data, root / "data.jsonl")
    return root


class PeakRss:
    """Samples a process's VmRSS on a thread every `period` seconds; .peak_kib, .samples."""

    def __init__(self, pid: int, period: float = 0.02):
        self.pid, self.period = pid, period
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append(vm_rss_kib(self.pid))
            except (FileNotFoundError, ProcessLookupError):
                return
            self._stop.wait(self.period)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(5)
        return self.peak_kib

    @property
    def peak_kib(self) -> int:
        return max(self.samples, default=0)
