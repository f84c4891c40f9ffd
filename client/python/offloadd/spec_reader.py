"""Reads plain data (dicts, lists, scalars from YAML or JSON job files) into a protobuf message
through google.protobuf.json_format.ParseDict, one field at a time so that every problem is
reported at once with its snake_case path ("training.max_steps", "dataset.paths[1]").

Only the job-file spellings that protobuf's JSON mapping lacks are translated first, as offloadctl's
reader (client/cpp/spec_reader.cc) reads them: enum values short or in any case ("alpaca" for
DATASET_FORMAT_ALPACA), byte sizes ("24GiB", "500MB"), None as unset. Types and ranges are
ParseDict's; what values mean (learning rates in range, NaN, unknown enum numbers, paths, the model)
is the daemon's to check when the job is submitted (job/job_validator.cc), and is not
repeated here. An unknown key is an error naming it, with a "did you mean" for near misses and the
message's fields.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional

from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from offloadd.errors import FieldViolation

# The uint64 fields of job.proto that hold byte sizes.
BYTE_SIZE_FIELDS = frozenset({
    "offloadd.v1.ResourceLimits.gpu_memory_limit",
    "offloadd.v1.ResourceLimits.host_memory_limit",
    "offloadd.v1.AioConfig.block_size",
})

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30,
          "t": 1 << 40, "tib": 1 << 40}


def parse_byte_size(value: Any) -> int:
    """24GiB, 500MB, 1.5 GiB or a plain number of bytes (common/units.h's ParseByteSize)."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte size (e.g. 4096, 512MiB, 24GiB)")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is not a byte size (e.g. 4096, 512MiB, 24GiB)")
        return value
    text = "".join(str(value).split())
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", text)
    if not m:
        raise ValueError(f"'{value}' is not a byte size (e.g. 4096, 512MiB, 24GiB)")
    unit = m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(f"unknown size unit '{unit}' in '{value}' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)")
    try:
        number = float(m.group(1))
    except ValueError:
        raise ValueError(f"'{value}' is not a byte size") from None
    size = number * _UNITS[unit]
    if size >= 2**64:
        raise ValueError(f"byte size '{value}' is too large")
    if size != math.floor(size):
        raise ValueError(f"byte size '{value}' is not a whole number of bytes")
    return int(size) if "." in m.group(1) else int(m.group(1)) * _UNITS[unit]


def edit_distance(a: str, b: str) -> int:
    """Optimal string alignment distance (Levenshtein with adjacent transpositions)."""
    d = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a) + 1):
        d[i][0] = i
    for j in range(len(b) + 1):
        d[0][j] = j
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]


def _normalized(s: str) -> str:
    return s.replace("_", "").replace("-", "").lower()


def nearest_name(name: str, candidates: Iterable[str]) -> Optional[str]:
    """The candidate closest to `name` when it is a near miss, else None (spec_reader.cc's rule:
    the same apart from case and underscores, or 1/2/3 edits for up to 4/8/more characters)."""
    if len(name) > 200:
        return None
    norm = _normalized(name)
    allowed = 1 if len(norm) <= 4 else 2 if len(norm) <= 8 else 3
    best, best_distance = None, allowed + 1
    for c in candidates:
        dist = edit_distance(norm, _normalized(c))
        if dist < best_distance:
            best, best_distance = c, dist
    return best


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _short(value: Any, limit: int = 80) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _field_index(d: Descriptor, path: str = "", depth: int = 0, index: Optional[dict] = None) -> dict:
    """Field name -> its paths under `d`, to point a field written in the wrong section to its place."""
    index = {} if index is None else index
    if depth > 8:
        return index
    for f in d.fields:
        index.setdefault(f.name, []).append(_child(path, f.name))
        if f.type == FieldDescriptor.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry:
            _field_index(f.message_type, _child(path, f.name), depth + 1, index)
    return index


def _kind(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return f"'{_short(value)}'"


def _is_map(f: FieldDescriptor) -> bool:
    return f.type == FieldDescriptor.TYPE_MESSAGE and f.message_type.GetOptions().map_entry


class _Spelling(ValueError):
    """A job-file spelling that does not translate (a byte size that does not parse)."""


def _reason(error: Exception) -> str:
    """ParseDict's message without its nesting ("Failed to parse x field: ") and location."""
    text = str(error)
    while (m := re.match(r"Failed to parse \w+ field: ", text)) is not None:
        text = text[m.end():]
    text = re.sub(r" at [\w.\[\]\"]+\.*$", "", text.strip())
    return text.rstrip(".")


class _Reader:
    def __init__(self, root: Descriptor, out: list):
        self.root = root
        self.out = out
        self._index: Optional[dict] = None

    def add(self, path: str, description: str) -> None:
        self.out.append(FieldViolation(path, description))

    def message(self, value: Any, path: str, msg: Message) -> bool:
        d = msg.DESCRIPTOR
        names = [f.name for f in d.fields]
        before = len(self.out)
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping of {', '.join(names)}, got {_kind(value)}")
            return False
        msg.SetInParent()
        seen = set()
        for key, v in value.items():
            key = str(key)
            f = d.fields_by_name.get(key) or next((x for x in d.fields if x.json_name == key), None)
            if f is None:
                self.unknown(path, key, names)
                continue
            where = _child(path, f.name)
            if f.number in seen:
                self.add(where, "given twice")
                continue
            seen.add(f.number)
            if v is None:
                continue  # unset, as in protobuf's JSON
            self.field(v, where, f, msg)
        return len(self.out) == before

    def unknown(self, path: str, key: str, names: list) -> None:
        near = nearest_name(key, names)
        if near is not None:
            hint = f"; did you mean `{near}`?"
        else:
            if self._index is None:
                self._index = _field_index(self.root)
            elsewhere = self._index.get(key)
            hint = f"; did you mean `{elsewhere[0]}`?" if elsewhere else ""
        what = path or "the job spec"
        self.add(_child(path, _short(key)), f"unknown field{hint} (fields of {what}: {', '.join(names)})")

    def field(self, v: Any, path: str, f: FieldDescriptor, msg: Message) -> None:
        """Nested messages recurse (their problems get their own paths); maps and lists are parsed
        entry by entry, so that each bad entry is named; scalars go to ParseDict as they are."""
        if _is_map(f):
            if not isinstance(v, dict):
                self.add(path, f"expected a mapping, got {_kind(v)}")
                return
            for k, item in v.items():
                self.parse(msg, f, {k: item}, f"{path}[{_short(k)}]")
            return
        if f.is_repeated:
            if not isinstance(v, list):
                self.add(path, f"expected a list, got {_kind(v)}")
                return
            for i, item in enumerate(v):
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    part = f.message_type._concrete_class()
                    if self.message(item, f"{path}[{i}]", part):
                        getattr(msg, f.name).append(part)
                else:
                    self.parse(msg, f, [item], f"{path}[{i}]")
            return
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            self.message(v, path, getattr(msg, f.name))
            return
        self.parse(msg, f, v, path)

    def parse(self, msg: Message, f: FieldDescriptor, value: Any, path: str) -> None:
        """ParseDict of {f: value} into a message of msg's type, merged into msg when it parses."""
        part = type(msg)()
        try:
            json_format.ParseDict({f.name: self.spelling(value, f)}, part)
        except _Spelling as e:
            self.add(path, str(e))
            return
        except json_format.ParseError as e:
            hint = self.enum_hint(value, f) if "Invalid enum value" in str(e) else None
            self.add(path, hint or _reason(e))
            return
        msg.MergeFrom(part)

    def spelling(self, value: Any, f: FieldDescriptor) -> Any:
        """The job-file spellings protobuf's JSON lacks, translated: enum names short or in any
        case, byte sizes. Anything else is left for ParseDict to take or refuse."""
        if _is_map(f):
            vf = f.message_type.fields_by_name["value"]
            return {k: self.spelling(item, vf) for k, item in value.items()}
        if isinstance(value, list):
            return [self.spelling(item, f) for item in value]
        if f.type == FieldDescriptor.TYPE_ENUM and isinstance(value, str):
            e = f.enum_type
            prefix = _enum_prefix(e)
            upper = value.strip().upper()
            found = e.values_by_name.get(upper) or e.values_by_name.get(prefix + upper)
            return found.name if found is not None else value
        if f.full_name in BYTE_SIZE_FIELDS:
            try:
                return parse_byte_size(value)
            except ValueError as err:
                raise _Spelling(str(err)) from None
        return value

    def enum_hint(self, value: Any, f: FieldDescriptor) -> Optional[str]:
        """For an enum name ParseDict did not know: the names a job file may use, and the nearest."""
        if _is_map(f):
            f = f.message_type.fields_by_name["value"]
            value = next(iter(value.values()), None)
        elif isinstance(value, list):
            value = value[0] if value else None
        if f.type != FieldDescriptor.TYPE_ENUM or not isinstance(value, str):
            return None
        prefix = _enum_prefix(f.enum_type)
        names = [x.name[len(prefix):].lower() if x.name.startswith(prefix) else x.name.lower()
                 for x in f.enum_type.values]
        names = [n for n in names if n != "unspecified"]
        near = nearest_name(value, names)
        hint = f"; did you mean `{near}`?" if near else ""
        return f"unknown value '{_short(value)}'{hint} (one of {', '.join(names)})"


def _enum_prefix(e) -> str:
    first = e.values[0].name
    return first[: first.rfind("UNSPECIFIED")] if "UNSPECIFIED" in first else ""


def read_message(value: Any, msg: Message, path: str = "") -> list:
    """Reads `value` into `msg`; returns the list of FieldViolation (empty when all of it read)."""
    out: list = []
    _Reader(msg.DESCRIPTOR, out).message(value, path, msg)
    return out
