"""The MLflow bridge: one MLflow run per job, found again by its ``offloadd.job_id`` tag.

Metrics carry Hugging Face's MLflowCallback names (``loss``, ``learning_rate``, ``grad_norm``,
``epoch``, ``eval_loss``, plus ``tokens_per_second``) at the job's optimizer step; the spec is
the run's parameters. Each batch of metrics goes to the server in one ``log_batch`` request
together with the tag ``offloadd.cursor``, the cursor of the last job event it covers, so what the
run holds and the cursor it records never disagree: following the job again reads the tag and
logs only the events after it. Private; ``offloadd.tracking.follow`` is the public entry."""

from __future__ import annotations

import logging
import re
from typing import Optional

from offloadd.tracking._rows import Row, flat_params, run_name, state_label
from offloadd.v1 import job_pb2

_log = logging.getLogger("offloadd.tracking")

JOB_TAG = "offloadd.job_id"
CURSOR_TAG = "offloadd.cursor"
STATE_TAG = "offloadd.state"
DEFAULT_EXPERIMENT = "offloadd"

# MLflow's run statuses for a job's final state.
RUN_STATUS = {
    job_pb2.JOB_STATE_SUCCEEDED: "FINISHED",
    job_pb2.JOB_STATE_FAILED: "FAILED",
    job_pb2.JOB_STATE_CANCELLED: "KILLED",
}

_PARAMS_PER_BATCH = 100  # MLflow's limit of params + tags in one log_batch
MAX_METRICS = 1000  # and of metrics: the most that ``log`` takes
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")  # characters MLflow refuses in names


class MlflowRun:
    """Logs one job to one MLflow run through ``mlflow.tracking.MlflowClient``. Not thread-safe."""

    name = "mlflow"

    def __init__(self, mlflow, job: job_pb2.Job, *, tracking_uri: Optional[str], experiment: Optional[str],
                 run_name_: Optional[str]):
        from mlflow.entities import Param, RunTag

        try:
            from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH
        except ImportError:  # an MLflow that moved it: its oldest limit
            MAX_PARAM_VAL_LENGTH = 500

        self._client = mlflow.tracking.MlflowClient(tracking_uri=tracking_uri)
        name = experiment or DEFAULT_EXPERIMENT
        found = self._client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found else self._client.create_experiment(name)
        runs = self._client.search_runs([experiment_id], filter_string=f"tags.`{JOB_TAG}` = '{job.id}'",
                                        max_results=1)
        if runs:
            run = runs[0]
            self.cursor = int(run.data.tags.get(CURSOR_TAG, "0"))
            if run.info.status != "RUNNING":
                self._client.update_run(run.info.run_id, status="RUNNING")
        else:
            run = self._client.create_run(experiment_id, run_name=run_name(job, run_name_),
                                          tags={JOB_TAG: job.id, CURSOR_TAG: "0"})
            self.cursor = 0
        self.run_id = run.info.run_id
        # Parameters never change in MLflow; the job's spec does not either, so logging them again
        # on a later follow writes the same values (which MLflow accepts).
        flat = flat_params(job.spec)
        cut = sorted(k for k, v in flat.items() if len(v) > MAX_PARAM_VAL_LENGTH)
        if cut:
            _log.warning("job %s: MLflow keeps %d characters of a parameter; cut: %s", job.id,
                         MAX_PARAM_VAL_LENGTH, ", ".join(cut))
        params = [Param(_key(k), v[:MAX_PARAM_VAL_LENGTH]) for k, v in flat.items()]
        params.append(Param("offloadd.job_id", job.id))
        for i in range(0, len(params), _PARAMS_PER_BATCH):
            self._client.log_batch(self.run_id, params=params[i:i + _PARAMS_PER_BATCH])
        self._run_tag = RunTag

    def log(self, rows: list[Row], cursor: int) -> None:
        """Logs the rows (at most ``MAX_METRICS`` values) and records ``cursor`` as the last event
        they cover, in one request: the run never holds metrics its cursor does not cover."""
        from mlflow.entities import Metric

        metrics = [Metric(_key(k), v, r.time_ms, r.step) for r in rows for k, v in r.values.items()]
        assert len(metrics) <= MAX_METRICS, len(metrics)
        self._client.log_batch(self.run_id, metrics=metrics, tags=[self._run_tag(CURSOR_TAG, str(cursor))])
        self.cursor = cursor

    def finish(self, job: job_pb2.Job) -> None:
        """Ends the run with the job's final state (FINISHED, FAILED or KILLED)."""
        self._client.set_tag(self.run_id, STATE_TAG, state_label(job.state))
        if job.error.message:
            self._client.set_tag(self.run_id, "offloadd.error", job.error.message[:5000])
        self._client.set_terminated(self.run_id, status=RUN_STATUS[job.state])

    def detach(self) -> None:
        """Leaves the run RUNNING (the follow stopped before the job ended)."""


def _key(name: str) -> str:
    return _BAD_KEY.sub("_", name)
