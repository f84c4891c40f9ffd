"""A job's progress as text: the status line offloadctl draws, for Client.wait(progress=True).

On a terminal the line is redrawn in place ("\\r" + line + clear-to-end-of-line) and other events
(state changes, logs, checkpoints) are printed on their own lines above it; on a pipe or file
every event is one line. The format matches offloadctl's:

    step 250/1000 [######..................]  25%  loss 2.3457  lr 3.0e-04  1234 tok/s  ETA 1:12:34
"""

from __future__ import annotations

import os
import shutil
from typing import Optional, TextIO

from offloadd.v1 import job_pb2

_CLEAR_TO_EOL = "\x1b[K"


def state_name(state: int) -> str:
    """"running" for JOB_STATE_RUNNING."""
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_").lower()


def render_progress_line(p: job_pb2.JobProgress, bar_width: int = 24) -> str:
    """The status line of a progress report: step, bar, loss, learning rate, tokens/s, the latest
    evaluation's loss, ETA."""
    out = f"step {p.step}"
    if p.max_steps > 0:
        frac = min(1.0, p.step / p.max_steps)
        filled = int(frac * bar_width + 1e-9)
        out += f"/{p.max_steps} [{'#' * filled}{'.' * (bar_width - filled)}] {int(frac * 100 + 1e-9):3d}%"
    out += f"  loss {p.loss:.4f}  lr {p.learning_rate:.1e}  {p.tokens_per_second:.0f} tok/s"
    if p.HasField("eval_loss"):
        out += f"  eval_loss {p.eval_loss:.4f} (step {p.eval_step})"
    if p.HasField("eta"):
        s = p.eta.seconds
        out += f"  ETA {s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return out


def render_event(e: job_pb2.JobEvent) -> str:
    """One line per event, as offloadctl prints it on a pipe ("[cursor] ...")."""
    kind = e.WhichOneof("event")
    if kind == "state_change":
        text = f"state {state_name(e.state_change.state)} {e.state_change.reason}"
    elif kind == "progress":
        text = render_progress_line(e.progress)
    elif kind == "log":
        text = e.log.message
    elif kind == "checkpoint_saved":
        text = f"checkpoint {e.checkpoint_saved.id} at step {e.checkpoint_saved.step}"
    else:
        text = ""
    return f"[{e.cursor}] {text}"


class ProgressPrinter:
    """Writes a job's events to a stream, as ``offloadctl watch`` does. Not thread-safe.

    Args:
        stream: where to write (``wait(progress=True)`` uses stderr).
        live: redraw a status line in place; default: whether ``stream`` is a terminal (TERM != dumb).
        columns: the terminal's width (the status line is cut to fit so it redraws cleanly).
    """

    def __init__(self, stream: TextIO, live: Optional[bool] = None, columns: Optional[int] = None):
        self._stream = stream
        if live is None:
            live = hasattr(stream, "isatty") and stream.isatty() and os.environ.get("TERM") != "dumb"
        self._live = live
        self._columns = max(20, columns or shutil.get_terminal_size().columns)
        self._status = ""
        self._first: Optional[tuple[int, float]] = None  # (step, time) of the first progress event

    def on_event(self, e: job_pb2.JobEvent) -> None:
        """Writes an event (as ``render`` draws it) and flushes; usable as ``wait``'s on_event."""
        self._stream.write(self.render(e))
        self._stream.flush()

    def close(self) -> None:
        """Ends the status line (a newline after it on a terminal)."""
        if self._live and self._status:
            self._stream.write("\n")
            self._stream.flush()
        self._status = ""

    def render(self, e: job_pb2.JobEvent) -> str:
        """The text ``on_event`` writes for an event (redraw codes included on a terminal)."""
        if not self._live:
            return render_event(e) + "\n"
        if e.HasField("progress"):
            self._status = self._status_line(self._with_eta(e))
            return "\r" + self._status + _CLEAR_TO_EOL
        out = ("\r" + _CLEAR_TO_EOL) if self._status else ""
        return out + render_event(e) + "\n" + self._status

    def _status_line(self, p: job_pb2.JobProgress) -> str:
        fit = self._columns - 1
        line = render_progress_line(p, 24)
        if len(line) > fit:
            line = render_progress_line(p, 10)
        return line[:fit]

    def _with_eta(self, e: job_pb2.JobEvent) -> job_pb2.JobProgress:
        """The event's progress with an ETA from the step rate seen so far when it has none."""
        p = job_pb2.JobProgress()
        p.CopyFrom(e.progress)
        at = e.time.seconds + e.time.nanos * 1e-9
        if self._first is None:
            self._first = (p.step, at)
        left = p.max_steps - p.step
        if p.HasField("eta") or p.max_steps <= 0 or left < 0:
            return p
        per_step = 0.0
        if p.HasField("step_time"):
            per_step = p.step_time.seconds + p.step_time.nanos * 1e-9
        elif p.step > self._first[0]:
            per_step = (at - self._first[1]) / (p.step - self._first[0])
        if per_step > 0:
            p.eta.seconds = round(per_step * left)
        return p
