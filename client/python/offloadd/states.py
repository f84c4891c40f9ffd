"""Job states as strings: ``offloadd.JobState``.

The API's ``offloadd.v1.JobState`` is a protobuf enum of integers named ``JOB_STATE_RUNNING`` and
so on. ``JobState`` is the same set as a ``str`` enum whose values are the short lower-case names
(``"queued"``, ``"running"``, ``"succeeded"``, ...), so a state compares equal to its name, prints
as it, and serialises to JSON as it::

    >>> JobState.of(client.get_job(job_id))
    <JobState.RUNNING: 'running'>
    >>> JobState.of(job) == "running"
    True
    >>> JobState.parse("JOB_STATE_FAILED"), JobState.parse(9), JobState.parse("Failed")
    (<JobState.FAILED: 'failed'>, <JobState.FAILED: 'failed'>, <JobState.FAILED: 'failed'>)

Everywhere the SDK takes a state (``Client.list_jobs(states=...)``), it accepts a ``JobState``,
its name in any case, the protobuf name, or the protobuf number.
"""

from __future__ import annotations

import enum
from typing import Any, Union

from offloadd.spec_reader import nearest_name
from offloadd.v1 import job_pb2

_PREFIX = "JOB_STATE_"


class JobState(str, enum.Enum):
    """A job's state, as its lower-case name (a ``str``).

    Members mirror ``offloadd.v1.JobState`` without the ``JOB_STATE_`` prefix. A member equals
    its name (``JobState.RUNNING == "running"``) and ``str()``/``format()`` give the name.
    ``.proto`` is the protobuf number, for building requests by hand.

    Lifecycle: ``validating`` -> ``queued`` -> ``running`` -> ``succeeded`` | ``failed``;
    ``running`` -> ``pausing`` -> ``paused`` -> ``queued`` on pause/resume; ``cancelling`` ->
    ``cancelled`` on cancel. ``succeeded``, ``failed`` and ``cancelled`` are final.
    """

    UNSPECIFIED = "unspecified"
    VALIDATING = "validating"
    QUEUED = "queued"
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"
    SUCCEEDED = "succeeded"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def proto(self) -> int:
        """The ``offloadd.v1.JobState`` number of this state (``JobState.RUNNING.proto == 3``)."""
        return job_pb2.JobState.Value(_PREFIX + self.name)

    @property
    def is_final(self) -> bool:
        """True for the states a job never leaves: succeeded, failed and cancelled."""
        return self in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)

    @classmethod
    def parse(cls, value: Union["JobState", str, int]) -> "JobState":
        """Reads a state written any way the SDK accepts.

        Args:
            value: a ``JobState``, a name in any case (``"running"``, ``"RUNNING"``), the
                protobuf name (``"JOB_STATE_RUNNING"``) or the protobuf number (``3``).

        Returns:
            The ``JobState``.

        Raises:
            ValueError: ``value`` names no state; the message lists the valid names and, for a
                near miss, says which one was probably meant.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                return cls[job_pb2.JobState.Name(value).removeprefix(_PREFIX)]
            except ValueError:
                raise ValueError(f"{value} is no offloadd.v1.JobState number") from None
        if isinstance(value, str):
            key = value.strip().upper().removeprefix(_PREFIX)
            if key in cls.__members__:
                return cls[key]
            names = [m.value for m in cls]
            near = nearest_name(value.strip().lower().removeprefix(_PREFIX.lower()), names)
            hint = f"; did you mean '{near}'?" if near else ""
            raise ValueError(f"unknown job state '{value}' (one of: {', '.join(names)}){hint}")
        raise TypeError(f"a job state is a JobState, a name or a number, not {type(value).__name__}")

    @classmethod
    def of(cls, obj: Any) -> "JobState":
        """The state of a protobuf message, or of anything ``parse`` reads.

        Args:
            obj: a ``Job``, a ``StateTransition``, a ``JobEvent`` carrying a state change, a
                ``JobState`` number, a name, or a ``JobState``.

        Returns:
            The ``JobState``; ``UNSPECIFIED`` for a ``JobEvent`` that is not a state change.
        """
        if isinstance(obj, job_pb2.JobEvent):
            return cls.parse(obj.state_change.state if obj.HasField("state_change") else 0)
        if isinstance(obj, (job_pb2.Job, job_pb2.StateTransition)):
            return cls.parse(obj.state)
        return cls.parse(obj)


def state_numbers(states: Any) -> list[int]:
    """``offloadd.v1.JobState`` numbers of a state or an iterable of states (any accepted form)."""
    if isinstance(states, (str, int)):  # one state, not an iterable of characters
        states = [states]
    return [JobState.parse(s).proto for s in states]
