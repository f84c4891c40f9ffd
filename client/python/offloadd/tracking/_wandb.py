"""The Weights & Biases bridge: one W&B run per job, whose run id is the job's id.

Metrics carry Hugging Face's WandbCallback names (``train/loss``, ``train/learning_rate``,
``train/grad_norm``, ``train/epoch``, ``eval/loss``, plus ``train/tokens_per_second``), plotted
against ``train/global_step``, the job's optimizer step (as the callback defines it); the spec is
the run's config. The run's summary key ``offloadd/cursor`` holds the cursor of the last job event
logged. Following the job again resumes the run (``resume="allow"``) and logs only later events:
online, W&B restores the summary; offline (``WANDB_MODE=offline``) every follow writes a new
offline-run directory for the same id, and the cursor is read from the earlier ones' ``.wandb``
files with W&B's own reader (``wandb leet inspect --summary --json``), so ``wandb sync`` of them all
uploads each event once. Private; ``offloadd.tracking.follow`` is the public entry."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys
from typing import Optional

from offloadd.tracking._rows import Row, run_name, spec_dict, state_label
from offloadd.v1 import job_pb2

CURSOR_KEY = "offloadd/cursor"
STEP_KEY = "train/global_step"
DEFAULT_PROJECT = "offloadd"

# The run's exit code for a job's final state: W&B shows 0 as finished and any other as failed;
# a cancelled job gets 143, the code of a process stopped by SIGTERM.
EXIT_CODE = {
    job_pb2.JOB_STATE_SUCCEEDED: 0,
    job_pb2.JOB_STATE_FAILED: 1,
    job_pb2.JOB_STATE_CANCELLED: 143,
}

_NAMES = {"loss": "train/loss", "learning_rate": "train/learning_rate", "grad_norm": "train/grad_norm",
          "tokens_per_second": "train/tokens_per_second", "epoch": "train/epoch", "eval_loss": "eval/loss"}


def run_id(job_id: str) -> str:
    """The W&B run id of a job: its id, with what W&B refuses in ids replaced."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", job_id)


class WandbRun:
    """Logs one job to one W&B run (``wandb.init(..., reinit="create_new")``, so a run the caller
    has open is left alone). Not thread-safe."""

    name = "wandb"

    def __init__(self, wandb, job: job_pb2.Job, *, project: Optional[str], entity: Optional[str],
                 directory: Optional[str], run_name_: Optional[str]):
        self._run = wandb.init(project=project or DEFAULT_PROJECT, entity=entity, dir=directory,
                               id=run_id(job.id), resume="allow", reinit="create_new",
                               name=run_name(job, run_name_), job_type="fine-tune",
                               config={"offloadd_job_id": job.id, **spec_dict(job.spec)})
        self.run_id = self._run.id
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        try:
            if self._run.offline:
                self.cursor = _offline_cursor(pathlib.Path(self._run.dir).parent, self.run_id)
            else:
                self.cursor = int(self._run.summary.get(CURSOR_KEY, 0) or 0)
        except BaseException:
            self._run.finish(exit_code=1)
            raise

    def log(self, rows: list[Row], cursor: int) -> None:
        """Logs each row as one history row at its step, then records ``cursor`` in the summary."""
        for r in rows:
            self._run.log({**{_NAMES[k]: v for k, v in r.values.items()}, STEP_KEY: r.step})
        self._run.summary[CURSOR_KEY] = cursor
        self.cursor = cursor

    def finish(self, job: job_pb2.Job) -> None:
        """Ends the run with the job's exit code (0 succeeded, 1 failed, 143 cancelled)."""
        self._run.summary["offloadd/state"] = state_label(job.state)
        self._run.finish(exit_code=EXIT_CODE[job.state])

    def detach(self) -> None:
        """Ends the run without an outcome (the follow stopped before the job ended); following
        the job again resumes it."""
        self._run.finish(exit_code=0)


def read_offline_summary(run_dir: pathlib.Path) -> dict:
    """W&B's summary of an offline run directory (its state, exit_code, config and summary), read
    by W&B's own reader of ``.wandb`` files."""
    r = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--summary", "--json", str(run_dir)],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"wandb leet inspect {run_dir} failed: {r.stderr.strip()[-2000:]}")
    return json.loads(r.stdout)


def _offline_cursor(current: pathlib.Path, rid: str) -> int:
    """The largest cursor that the earlier offline runs of ``rid`` beside ``current`` (the run
    directory this follow writes) logged."""
    cursor = 0
    for d in current.parent.glob(f"offline-run-*-{rid}"):
        if d == current or not (d / f"run-{rid}.wandb").is_file():
            continue
        try:
            summary = read_offline_summary(d).get("summary", {})
        except (RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"cannot tell what the earlier offline run {d} logged "
                               f"(remove it or sync it first): {e}") from None
        cursor = max(cursor, int(summary.get(CURSOR_KEY, 0) or 0))
    return cursor
