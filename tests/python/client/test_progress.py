"""The progress text of Client.wait(progress=True): same format as offloadctl's."""

from __future__ import annotations

import io

from offloadd.progress import ProgressPrinter, render_event, render_progress_line
from offloadd.v1 import job_pb2


def progress_event(cursor, step, max_steps, at):
    e = job_pb2.JobEvent(cursor=cursor)
    e.time.seconds = at
    e.progress.step, e.progress.max_steps = step, max_steps
    e.progress.loss, e.progress.learning_rate, e.progress.tokens_per_second = 2.5, 1e-4, 900
    return e


def test_progress_line_matches_offloadctl():
    p = job_pb2.JobProgress(step=250, max_steps=1000, loss=2.34567, learning_rate=3e-4, tokens_per_second=1234.4)
    p.eta.seconds = 3600 + 12 * 60 + 34
    assert render_progress_line(p, 8) == "step 250/1000 [##......]  25%  loss 2.3457  lr 3.0e-04  1234 tok/s  ETA 1:12:34"
    assert render_progress_line(job_pb2.JobProgress(step=7, loss=1.5)) == "step 7  loss 1.5000  lr 0.0e+00  0 tok/s"
    assert render_progress_line(job_pb2.JobProgress(step=8, loss=1.5, eval_loss=1.25, eval_step=8)) == \
        "step 8  loss 1.5000  lr 0.0e+00  0 tok/s  eval_loss 1.2500 (step 8)"  # as offloadctl's


def test_live_printer_redraws_the_status_line_and_prints_events_above_it():
    out = io.StringIO()
    printer = ProgressPrinter(out, live=True, columns=120)
    started = job_pb2.JobEvent(cursor=1)
    started.state_change.state = job_pb2.JOB_STATE_RUNNING
    started.state_change.reason = "started"
    log = job_pb2.JobEvent(cursor=3)
    log.log.message = "checkpoint soon"
    line = "step 5/10 [############............]  50%  loss 2.5000  lr 1.0e-04  900 tok/s"
    assert printer.render(started) == "[1] state running started\n"
    assert printer.render(progress_event(2, 5, 10, 100)) == "\r" + line + "\x1b[K"
    assert printer.render(log) == "\r\x1b[K[3] checkpoint soon\n" + line
    printer.close()
    assert out.getvalue() == "\n"


def test_eta_from_the_observed_step_rate():
    printer = ProgressPrinter(io.StringIO(), live=True, columns=200)
    assert "ETA" not in printer.render(progress_event(1, 10, 100, 1000))
    assert "ETA 0:02:40" in printer.render(progress_event(2, 20, 100, 1020))


def test_pipe_gets_one_line_per_event_and_narrow_terminal_a_cut_line():
    e = progress_event(4, 3, 10, 100)
    assert ProgressPrinter(io.StringIO(), live=False).render(e) == render_event(e) + "\n"
    drawn = ProgressPrinter(io.StringIO(), live=True, columns=60).render(e)
    assert drawn.startswith("\rstep 3/10 [###.......]") and len(drawn) - 4 <= 59
