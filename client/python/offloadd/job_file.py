"""Job specs from dicts and YAML job files, with job.proto's field names.

Enum values may be written in full ("DATASET_FORMAT_ALPACA") or short ("alpaca"). Unknown
fields raise ValueError naming the field (nothing is silently dropped), as in offloadctl.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import yaml
from google.protobuf import json_format

from offloadd.v1 import job_pb2

_ENUM_FIELDS = {
    "format": "DATASET_FORMAT_",
    "device": "OFFLOAD_DEVICE_",
    "mode": "ACTIVATION_MODE_",
    "layer_overrides": "ACTIVATION_MODE_",
    "type": "COMPRESSION_TYPE_",
    "compute_dtype": "COMPUTE_DTYPE_",
    "dropout": "DROPOUT_MODE_",
}


# A job spec is small; YAML aliases can make a few hundred bytes expand into billions of values
# (a "billion laughs" alias bomb). Expansion stops at these bounds, as offloadctl's does.
MAX_JOB_FILE_VALUES = 100_000
MAX_JOB_FILE_DEPTH = 64


def _expand_enums(value: Any, key: str = "", budget: Optional[list] = None, depth: int = 0) -> Any:
    budget = [MAX_JOB_FILE_VALUES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_JOB_FILE_DEPTH:
        raise ValueError(f"the job spec expands to more than {MAX_JOB_FILE_VALUES} values or "
                         f"{MAX_JOB_FILE_DEPTH} levels of nesting (YAML aliases?); a job spec is far smaller")
    if isinstance(value, dict):
        return {k: _expand_enums(v, key if key == "layer_overrides" else k, budget, depth + 1)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_expand_enums(v, key, budget, depth + 1) for v in value]
    prefix = _ENUM_FIELDS.get(key)
    if prefix and isinstance(value, str):
        upper = value.upper()
        return upper if any(upper.startswith(p) for p in _ENUM_FIELDS.values()) else prefix + upper
    return value


def job_spec(spec: Union[job_pb2.JobSpec, dict, str, os.PathLike]) -> job_pb2.JobSpec:
    """A JobSpec from a JobSpec, a dict, or the path of a YAML/JSON job file."""
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    source = "job spec"
    if isinstance(spec, (str, os.PathLike)):
        source = os.fspath(spec)
        with open(spec) as f:
            spec = yaml.safe_load(f)
        if not isinstance(spec, dict):
            raise ValueError(f"{source}: a job file must be a mapping of JobSpec fields")
    try:
        return json_format.ParseDict(_expand_enums(spec), job_pb2.JobSpec(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError) as e:
        raise ValueError(f"{source}: {e}") from None
