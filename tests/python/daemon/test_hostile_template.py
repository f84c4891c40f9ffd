"""A chat template given as dataset.template runs inside CreateJob. An 84-byte
template pegged a core and held ~4.3 GB per request, a 57-byte one drove the daemon to 15.2 GB,
and {{ 99999999999999999999 }} came back as UNKNOWN (an uncaught std::out_of_range). Each must
now be INVALID_ARGUMENT naming dataset.template's limit within seconds, with the daemon's peak
memory bounded and the daemon still serving."""

from __future__ import annotations

import json
import pathlib
import sys
import time

import grpc
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from daemon_process import DaemonProcess  # noqa: E402
from test_create_job import _vm_hwm_bytes, spec_dict, workspace  # noqa: E402,F401

import offloadd  # noqa: E402

HOSTILE = {
    "nested-loops": "{% for i in range(10**6) %}{% for j in range(10**6) %}{% endfor %}{% endfor %}",
    "string-doubling": "{% set n = namespace(s='x') %}{% for i in range(64) %}{% set n.s = n.s ~ n.s %}"
                       "{% endfor %}{{ n.s }}",
    "repetition": "{% for i in range(10**6) %}{{ 'x' * 10**8 }}{% endfor %}",
    "huge-range": "{{ range(10**12) | list | length }}",
    "self-holding-namespace": "{% set n = namespace() %}{% set n.me = n %}{{ n }}",
    "recursive-macro": "{% macro f(x) %}{{ f(x ~ x) }}{% endmacro %}{{ f('x') }}",
    "huge-int": "{{ 99999999999999999999 }}",
    "huge-float": "{{ 1e999 }}",
    "int-overflow-trap": "{{ (-9223372036854775807 - 1) // -1 }}",
}


@pytest.fixture()
def daemon(binary_dir, workspace):  # noqa: F811
    d = DaemonProcess(binary_dir / "daemon" / "offloadd", workspace).start()
    yield d
    d.stop()


def test_hostile_templates_are_refused_quickly_with_bounded_memory(daemon, workspace):  # noqa: F811
    data = workspace / "chat.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "yo"}]}) + "\n")
    spec = spec_dict(workspace)
    spec["dataset"]["paths"] = [str(data)]
    spec["dataset"]["format"] = "DATASET_FORMAT_MESSAGES"
    with offloadd.Client(daemon.target) as c:
        c.create_job(spec, validate_only=True)  # warm: the tokenizer and template paths are loaded
        before = _vm_hwm_bytes(daemon.proc.pid)
        for name, source in HOSTILE.items():
            template = workspace / f"{name}.jinja"
            template.write_text(source)
            spec["dataset"]["template"] = str(template)
            t0 = time.monotonic()
            with pytest.raises(offloadd.OffloaddError) as e:
                c.create_job(spec, validate_only=True)
            took = time.monotonic() - t0
            assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT, (name, e.value)
            fields = [v.field for v in e.value.field_violations]
            assert any(f.startswith("dataset.") for f in fields), (name, e.value)
            assert took < 10, f"{name}: {took:.1f} s"
            print(f"{name}: refused in {took:.2f} s: {str(e.value)[:160]}")
        grown = _vm_hwm_bytes(daemon.proc.pid) - before
        assert grown < 768 << 20, f"peak RSS grew by {grown >> 20} MiB"
        print(f"peak RSS grew by {grown >> 20} MiB over {len(HOSTILE)} hostile templates")
        spec["dataset"].pop("template")
        assert c.create_job(spec, validate_only=True).spec.dataset.paths, "the daemon still serves"
