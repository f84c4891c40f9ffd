"""The SDK's docstrings render as a reference page with pydoc (text, and HTML
with `python -m pydoc -w`), and every public class, method and property has one, Google style
(an Args: section where there are arguments)."""

from __future__ import annotations

import inspect
import os
import pathlib
import pydoc
import subprocess
import sys

import offloadd

KEY_NAMES = ["Client", "AsyncClient", "JobResult", "JobState", "JobFailed", "JobCancelled", "WaitTimeout",
             "InvalidArgument", "FieldViolation"]
KEY_TEXT = [
    "fine_tuned_model", "trained_tokens", "raise_on_failure", "the exported Hugging Face model",
    "Waits until the job is succeeded, failed or cancelled",  # Client.wait
    "Yields every job, all pages",                          # list_jobs
    "as a ``JobResult``",                                   # result
    "A job's state, as its lower-case name",                # JobState
    "An asyncio connection to offloadd",                    # AsyncClient
]


def public_members(cls):
    """(name, member) for the class's own public methods and properties."""
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, (classmethod, staticmethod)):
            value = value.__func__
        if inspect.isfunction(value) or isinstance(value, property):
            yield name, value


def test_every_public_name_has_a_docstring():
    missing, no_args = [], []
    for name in offloadd.__all__:
        obj = getattr(offloadd, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        if not inspect.getdoc(obj):
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for member_name, member in public_members(obj):
            doc = inspect.getdoc(member) or ""
            if not doc:
                missing.append(f"{name}.{member_name}")
                continue
            if isinstance(member, property):
                continue
            params = [p for p in inspect.signature(member).parameters if p not in ("self", "cls")]
            if params and "Args:" not in doc and obj.__module__.startswith("offloadd.") and name != "ProgressPrinter":
                no_args.append(f"{name}.{member_name}")
    assert not missing, f"without a docstring: {missing}"
    assert not no_args, f"without an Args: section: {no_args}"


def test_pydoc_renders_the_reference_page():
    text = pydoc.render_doc(offloadd, renderer=pydoc.plaintext)
    for name in KEY_NAMES:
        assert f"class {name}" in text, name
    for snippet in KEY_TEXT:
        assert snippet in text, snippet
    for method in ["health", "node_info", "create_job", "submit", "get_job", "list_jobs", "cancel_job", "pause_job",
                   "resume_job", "watch_job", "wait", "result", "list_checkpoints"]:
        assert f"{method}(self" in text, method
    assert "async result(self" in text or "result(self, job_id: str, *, wait: bool = True" in text
    client_doc = pydoc.render_doc(offloadd.AsyncClient, renderer=pydoc.plaintext)
    assert "async watch_job(self" in client_doc and "async wait(self" in client_doc


def test_pydoc_writes_html(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(pathlib.Path(offloadd.__file__).parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    for module in ["offloadd", "offloadd.aio", "offloadd.result", "offloadd.states"]:
        r = subprocess.run([sys.executable, "-m", "pydoc", "-w", module], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and f"wrote {module}.html" in r.stdout, r.stdout + r.stderr
    page = (tmp_path / "offloadd.html").read_text()
    for name in KEY_NAMES:
        assert name in page, name
    assert "fine_tuned_model" in page and "raise_on_failure" in page
    assert "trained_tokens" in (tmp_path / "offloadd.result.html").read_text()
