"""Experiment trackers for offloadd jobs: ``follow`` streams a job's config and metrics into an
MLflow or Weights & Biases run as they arrive, through those projects' own client libraries, and
ends the run with the job's outcome. (TensorBoard needs no bridge: ``training.report_to:
[tensorboard]`` has the daemon write event files itself.)

::

    import offloadd, offloadd.tracking

    with offloadd.Client() as c:
        job = c.submit("job.yaml")
        offloadd.tracking.follow(job.id, to="mlflow", client=c,
                                 tracking_uri="http://127.0.0.1:5000", experiment="llama-sft")

docs/tracking.md has the guide: which names each tracker gets, and how a second ``follow`` of the
same job continues its run without logging anything twice.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Optional, Union

from offloadd.client import Client
from offloadd.tracking._rows import Row, RowReader
from offloadd.v1 import job_pb2

TRACKERS = ("mlflow", "wandb")

# The package to install for each tracker (imported only when used).
_PACKAGES = {"mlflow": ("mlflow", "mlflow-skinny"), "wandb": ("wandb", "wandb")}
# Options that only one tracker takes.
_OWN_OPTIONS = {"tracking_uri": "mlflow", "entity": "wandb", "directory": "wandb"}
_MAX_VALUES = 1000  # metric values per request (MLflow's log_batch limit)


@dataclasses.dataclass(frozen=True)
class FollowResult:
    """What ``follow`` did.

    Attributes:
        tracker: "mlflow" or "wandb".
        run_id: the tracker's run id (W&B: the job's id).
        job: the ``offloadd.v1.Job`` as it ended.
        rows: metric rows logged by this call (one per training step, one per evaluation).
        resumed_after: the cursor of the last job event an earlier follow had logged (0: none);
            this call logged only events after it.
    """

    tracker: str
    run_id: str
    job: job_pb2.Job
    rows: int
    resumed_after: int


def follow(
    job: Union[str, job_pb2.Job],
    to: str,
    *,
    client: Optional[Client] = None,
    target: Optional[str] = None,
    run_name: Optional[str] = None,
    experiment: Optional[str] = None,
    tracking_uri: Optional[str] = None,
    entity: Optional[str] = None,
    directory: Optional[str] = None,
    timeout: Optional[float] = None,
    flush_seconds: float = 1.0,
) -> FollowResult:
    """Logs a job to an experiment tracker until the job ends, and ends the tracker's run with
    the job's outcome (MLflow: FINISHED, FAILED or KILLED; W&B: exit code 0, 1 or 143).

    The run's config is the job's spec (MLflow: flat parameters such as ``training.learning_rate``;
    W&B: the nested config); its metrics are every step's loss, learning rate, grad norm, tokens/s
    and epoch, and each evaluation's loss, at the job's optimizer step, in the names Hugging
    Face's callbacks use for that tracker. A job that has already run is logged from its first
    event on; following a job again (after an interruption, or twice) continues the same run
    after the last event it logged, so nothing is logged twice (docs/tracking.md says how).

    Args:
        job: the job's id, or the ``offloadd.v1.Job``.
        to: "mlflow" or "wandb".
        client: the ``offloadd.Client`` to use; default: one opened on ``target`` (then closed).
        target: the daemon, as for ``Client`` (without ``client``).
        run_name: the run's name; default: the job's display_name, else its id.
        experiment: MLflow's experiment name or W&B's project; default "offloadd".
        tracking_uri: MLflow only: the tracking server (default: ``$MLFLOW_TRACKING_URI``).
        entity: W&B only: the team or user (default: W&B's).
        directory: W&B only: where its files go (``wandb.init``'s ``dir``).
        timeout: the longest wait for the job to end, in seconds (None: no limit).
        flush_seconds: metrics are sent in batches, at most this long after they arrive (or
            when the next event does).

    Returns:
        A ``FollowResult``.

    Raises:
        ValueError: ``to`` names no tracker, or an option the tracker does not take.
        TypeError: ``client`` is not an ``offloadd.Client`` (an ``AsyncClient``, say).
        ImportError: the tracker's package is not installed (the message says which to install).
        NotFound: no such job. WaitTimeout: ``timeout`` passed (the run stays open, and a later
            ``follow`` continues it). Errors of the tracker's library are raised as they are.
    """
    if to not in TRACKERS:
        raise ValueError(f"unknown tracker to={to!r}: offloadd.tracking.follow logs to {' or '.join(TRACKERS)} "
                         "(TensorBoard: training.report_to: [tensorboard])")
    given = {"tracking_uri": tracking_uri, "entity": entity, "directory": directory}
    for option, owner in _OWN_OPTIONS.items():
        if given[option] is not None and owner != to:
            raise ValueError(f"{option}= is an option of to={owner!r}, not of to={to!r}")
    if client is not None and not isinstance(client, Client):
        raise TypeError(f"client= takes an offloadd.Client, not {type(client).__name__} (follow is "
                        "synchronous: from asyncio, run it in a thread with asyncio.to_thread)")
    module = _import(to)
    own_client = client is None
    c = client if client is not None else Client(target)
    try:
        job_now = c.get_job(job if isinstance(job, str) else job.id)
        run = _open_run(to, module, job_now, run_name=run_name, experiment=experiment,
                        tracking_uri=tracking_uri, entity=entity, directory=directory)
        return _stream(c, job_now.id, run, timeout, flush_seconds)
    finally:
        if own_client:
            c.close()


def _import(to: str):
    module, package = _PACKAGES[to]
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"offloadd.tracking.follow(to={to!r}) needs the {module!r} package, which "
                          f"does not import ({e}): pip install {package}") from e


def _open_run(to, module, job, *, run_name, experiment, tracking_uri, entity, directory):
    if to == "mlflow":
        from offloadd.tracking._mlflow import MlflowRun

        return MlflowRun(module, job, tracking_uri=tracking_uri, experiment=experiment, run_name_=run_name)
    from offloadd.tracking._wandb import WandbRun

    return WandbRun(module, job, project=experiment, entity=entity, directory=directory, run_name_=run_name)


class _Batch:
    """The rows of events not yet sent, and the cursor of the last event they cover."""

    def __init__(self, run, flush_seconds: float):
        self.run = run
        self.flush_seconds = flush_seconds
        self.rows: list[Row] = []
        self.values = 0
        self.cursor = run.cursor
        self.reader = RowReader()
        self.sent_at = time.monotonic()
        self.logged = 0

    def add(self, event: job_pb2.JobEvent) -> None:
        rows = self.reader.rows(event)
        values = sum(len(r.values) for r in rows)
        if self.values + values > _MAX_VALUES:
            self.flush()
        self.rows += rows
        self.values += values
        self.cursor = event.cursor
        if event.HasField("state_change") or time.monotonic() - self.sent_at >= self.flush_seconds:
            self.flush()

    def flush(self) -> None:
        if self.cursor > self.run.cursor:
            self.run.log(self.rows, self.cursor)
            self.logged += len(self.rows)
        self.rows, self.values, self.sent_at = [], 0, time.monotonic()


def _stream(c: Client, job_id: str, run, timeout, flush_seconds) -> FollowResult:
    resumed_after = run.cursor
    batch = _Batch(run, flush_seconds)
    try:
        final = c.wait(job_id, timeout=timeout, on_event=batch.add, after_cursor=run.cursor)
        batch.flush()
    except BaseException:
        run.detach()
        raise
    run.finish(final)
    return FollowResult(run.name, run.run_id, final, batch.logged, resumed_after)


__all__ = ["FollowResult", "TRACKERS", "follow"]
