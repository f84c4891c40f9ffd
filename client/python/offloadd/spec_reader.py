"""Reads plain data (dicts, lists, scalars from YAML or JSON) into a protobuf message by its
descriptor, as offloadctl's client/cpp/spec_reader.cc does: field names as in the .proto
(snake_case; lowerCamelCase JSON names are accepted too), enum values in full or short (any case),
byte sizes as 24GiB/500MB/plain bytes, None as "unset". Every problem is collected with its
snake_case path ("training.max_grad_norm", "dataset.paths[1]") instead of stopping at the first,
with a "did you mean" for near misses and the list of the message's fields for unknown ones.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional

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
        if _is_map(f):
            if not isinstance(v, dict):
                self.add(path, f"expected a mapping, got {_kind(v)}")
                return
            kf, vf = f.message_type.fields_by_name["key"], f.message_type.fields_by_name["value"]
            target = getattr(msg, f.name)
            for k, item in v.items():
                where = f"{path}[{_short(k)}]"
                ok_k, key = self.scalar(k, where, kf)
                if not ok_k:
                    continue
                if vf.type == FieldDescriptor.TYPE_MESSAGE:
                    self.message(item, where, target[key])
                else:
                    ok_v, value = self.scalar(item, where, vf)
                    if ok_v:
                        target[key] = value
            return
        if f.is_repeated:
            if not isinstance(v, list):
                self.add(path, f"expected a list, got {_kind(v)}")
                return
            target = getattr(msg, f.name)
            for i, item in enumerate(v):
                where = f"{path}[{i}]"
                if f.type == FieldDescriptor.TYPE_MESSAGE:
                    if not self.message(item, where, target.add()):
                        del target[-1]
                else:
                    ok, value = self.scalar(item, where, f)
                    if ok:
                        target.append(value)
            return
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            self.message(v, path, getattr(msg, f.name))
            return
        ok, value = self.scalar(v, path, f)
        if ok:
            setattr(msg, f.name, value)

    def scalar(self, v: Any, path: str, f: FieldDescriptor):
        """(True, the value for `f`) or (False, None) with a violation added."""
        if isinstance(v, (dict, list)):
            expected = "a string" if f.type == FieldDescriptor.TYPE_STRING else "a single value"
            self.add(path, f"expected {expected}, got {_kind(v)}")
            return False, None
        t = f.type
        if t == FieldDescriptor.TYPE_STRING:
            if isinstance(v, bool):
                v = "true" if v else "false"
            return True, str(v)
        if t == FieldDescriptor.TYPE_BOOL:
            if isinstance(v, bool):
                return True, v
            if isinstance(v, str) and v.lower() in ("true", "false"):
                return True, v.lower() == "true"
            self.add(path, f"expected true or false, got '{_short(v)}'")
            return False, None
        if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
            try:
                if isinstance(v, bool):
                    raise ValueError
                number = float(v)
                if not math.isfinite(number):
                    raise ValueError
                return True, number
            except ValueError:
                self.add(path, f"expected a number, got '{_short(v)}'")
                return False, None
        if t == FieldDescriptor.TYPE_ENUM:
            return self.enum(v, path, f)
        return self.integer(v, path, f)

    def integer(self, v: Any, path: str, f: FieldDescriptor):
        if f.full_name in BYTE_SIZE_FIELDS:
            try:
                return True, parse_byte_size(v)
            except ValueError as e:
                self.add(path, str(e))
                return False, None
        number: Optional[int] = None
        if isinstance(v, int) and not isinstance(v, bool):
            number = v
        elif not isinstance(v, bool):
            try:
                number = int(str(v).strip(), 10)
            except ValueError:
                try:
                    d = float(v)  # 1e3 and 1000.0 are whole numbers too, as protobuf's JSON reads them
                    number = int(d) if math.isfinite(d) and d == math.floor(d) else None
                except ValueError:
                    number = None
        if number is None:
            self.add(path, f"expected a whole number, got '{_short(v)}'")
            return False, None
        bits = 32 if t32(f) else 64
        lo, hi = (0, 2**bits - 1) if unsigned(f) else (-(2**(bits - 1)), 2**(bits - 1) - 1)
        if not lo <= number <= hi:
            self.add(path, f"'{_short(v)}' is out of range for {'u' if unsigned(f) else ''}int{bits}")
            return False, None
        return True, number

    def enum(self, v: Any, path: str, f: FieldDescriptor):
        e = f.enum_type
        prefix = e.values[0].name[: e.values[0].name.rfind("UNSPECIFIED")]
        value = None
        if isinstance(v, int) and not isinstance(v, bool):
            value = e.values_by_number.get(v)
        elif isinstance(v, str):
            upper = v.upper()
            value = e.values_by_name.get(upper) or e.values_by_name.get(prefix + upper)
        if value is None:
            names = [x.name[len(prefix):].lower() if x.name.startswith(prefix) else x.name.lower() for x in e.values]
            names = [n for n in names if n != "unspecified"]
            near = nearest_name(str(v), names)
            hint = f"; did you mean `{near}`?" if near else ""
            self.add(path, f"unknown value '{_short(v)}'{hint} (one of {', '.join(names)})")
            return False, None
        return True, value.number


def t32(f: FieldDescriptor) -> bool:
    return f.cpp_type in (FieldDescriptor.CPPTYPE_INT32, FieldDescriptor.CPPTYPE_UINT32)


def unsigned(f: FieldDescriptor) -> bool:
    return f.cpp_type in (FieldDescriptor.CPPTYPE_UINT32, FieldDescriptor.CPPTYPE_UINT64)


def read_message(value: Any, msg: Message, path: str = "") -> list:
    """Reads `value` into `msg`; returns the list of FieldViolation (empty when all of it read)."""
    out: list = []
    _Reader(msg.DESCRIPTOR, out).message(value, path, msg)
    return out
