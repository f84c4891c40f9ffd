"""The fault suite's harness.

* `@pytest.mark.timeout(seconds)`: every test here carries one. pytest-timeout is not in the
  venv, so the bound is kept here: SIGALRM fails the test in the main thread, and faulthandler
  dumps every thread and exits the process 30 s later if the test is stuck in C code.
* `figures`: each test records what it did, what happened and what was lost. At the end of the
  session the records are printed (terminal summary, also under -q), written as JSON to
  <pytest basetemp>/faults_summary.json, and, with OFFLOADD_FAULTS_REPORT=<file>, rendered as the
  Markdown tables docs/faults.md carries.
* OFFLOADD_FAULTS_FULL=1 selects the long campaign (more kill points, more clients);
  OFFLOADD_FAULTS_SEED picks the random kill points (default 18)."""

from __future__ import annotations

import faulthandler
import json
import os
import pathlib
import signal
import sys
import time

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from faultlib import FULL, SEED  # noqa: E402

_RECORDS: list[dict] = []
HARD_EXIT_MARGIN_S = 30


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): fail the test when it runs longer than this")


class SuiteTimeout(BaseException):
    """Raised in the test's main thread by SIGALRM (BaseException: code under test catching
    Exception does not swallow it)."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    m = item.get_closest_marker("timeout")
    if m is None:
        yield
        return
    seconds = float(m.args[0])

    def on_alarm(signum, frame):
        raise SuiteTimeout(f"{item.nodeid} ran past its timeout of {seconds:.0f} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + HARD_EXIT_MARGIN_S, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


class Figures:
    """One test's record: did (what was done), happened (what the system did), lost (what was
    lost: steps redone, bytes of the final weights that differ, data written outside the
    roots...), and numbers for the tables."""

    def __init__(self, nodeid: str):
        self.nodeid = nodeid
        self.did: list[str] = []
        self.happened: list[str] = []
        self.lost: list[str] = []
        self.numbers: dict = {}
        self.rows: list[dict] = []  # per-event detail (one per kill point, per case...)
        self.defects: list[str] = []

    def defect(self, text: str) -> str:
        """Names a defect the test found; returns the text for the assertion message."""
        self.defects.append(text)
        return "DEFECT: " + text

    def as_dict(self) -> dict:
        return {"test": self.nodeid, "did": self.did, "happened": self.happened, "lost": self.lost,
                "numbers": self.numbers, "rows": self.rows, "defects": self.defects}


@pytest.fixture()
def figures(request):
    f = Figures(request.node.nodeid)
    t0 = time.monotonic()
    yield f
    d = f.as_dict()
    rep = getattr(request.node, "rep_call", None)
    d["outcome"] = rep.outcome if rep else "error"
    d["seconds"] = round(time.monotonic() - t0, 2)
    if rep is not None and rep.failed and not f.defects:
        d["failure"] = str(rep.longrepr).splitlines()[-1][:500] if rep.longrepr else ""
    _RECORDS.append(d)
    print(f"\n[faults] {d['test']}: {d['outcome']} in {d['seconds']} s")
    for key in ("did", "happened", "lost", "defects"):
        for line in d[key]:
            print(f"  {key}: {line}")


def render_markdown(records: list[dict]) -> str:
    out = [f"Seed {SEED}, {'full campaign' if FULL else 'CI scale'}.", "",
           "| test | outcome | s | what was done | what happened | what was lost |",
           "|---|---|---|---|---|---|"]
    for r in records:
        name = r["test"].split("::", 1)[-1]
        cell = lambda xs: "<br>".join(x.replace("|", "\\|") for x in xs)  # noqa: E731
        happened = r["happened"] + [f"**DEFECT:** {x}" for x in r["defects"]]
        out.append(f"| `{name}` | {r['outcome']} | {r['seconds']} | {cell(r['did'])} | {cell(happened)} | {cell(r['lost'])} |")
    kills = [row for r in records for row in r["rows"] if "kill" in row]
    if kills:
        out += ["", "Kill points:", "",
                "| process | # | target step | delay ms | step at kill | last event | resumed from | steps redone | recovery | recovery s |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for row in kills:
            out.append(f"| {row['kill']} | {row['n']} | {row['target']} | {row['delay_ms']} | {row['step_at_kill']} | "
                       f"{row['last_event']} | {row['resumed_from']} | {row['steps_redone']} | {row['recovery']} | "
                       f"{row['recovery_s']} |")
    return "\n".join(out) + "\n"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _RECORDS:
        return
    base = config._tmp_path_factory.getbasetemp() if hasattr(config, "_tmp_path_factory") else pathlib.Path(".")
    path = pathlib.Path(base) / "faults_summary.json"
    path.write_text(json.dumps({"seed": SEED, "full": FULL, "tests": _RECORDS}, indent=2))
    tr = terminalreporter
    tr.section("fault suite figures")
    tr.write_line(render_markdown(_RECORDS))
    tr.write_line(f"JSON summary: {path}")
    report = os.environ.get("OFFLOADD_FAULTS_REPORT")
    if report:
        pathlib.Path(report).write_text(render_markdown(_RECORDS))
        tr.write_line(f"Markdown figures: {report}")
