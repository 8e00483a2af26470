"""Health reports to and from JSON-ready dicts (``specpair health --json`` output).

Markers are tagged so nothing is confused with a value:
``{"skipped": "NOT_SUPPORTED", "call": ...}`` and ``{"failed": "GPU_IS_LOST", "code": 15,
"call": ...}``. Decoding checks every field against the dataclass types and
names the first path that does not fit.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from specpair.health.errors import ReportError
from specpair.health.model import Failed, HostReport, Skipped

__all__ = ["to_dict", "report_from_dict"]


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain JSON values."""
    if isinstance(obj, Skipped):
        return {"skipped": obj.reason, "call": obj.call}
    if isinstance(obj, Failed):
        return {"failed": obj.error, "code": obj.code, "call": obj.call}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_dict(x) for x in obj]
    return obj


def report_from_dict(data: Any) -> HostReport:
    """Decode one host's report (the ``report`` object of ``specpair health --json``)."""
    return _decode(HostReport, data, "report")


def _decode(tp: Any, v: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(typing.get_args(tp), v, path)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(v, list):
            raise ReportError(f"{path}: expected a list, got {type(v).__name__}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], x, f"{path}[{i}]") for i, x in enumerate(v))
        if len(v) != len(args):
            raise ReportError(f"{path}: expected {len(args)} items, got {len(v)}")
        return tuple(_decode(a, x, f"{path}[{i}]") for i, (a, x) in enumerate(zip(args, v,
                                                                                   strict=True)))
    if dataclasses.is_dataclass(tp):
        if not isinstance(v, dict):
            raise ReportError(f"{path}: expected an object, got {type(v).__name__}")
        hints = typing.get_type_hints(tp)
        names = [f.name for f in dataclasses.fields(tp)]
        if set(v) != set(names):
            raise ReportError(f"{path}: fields {sorted(set(v) ^ set(names))} missing or unknown")
        return tp(**{n: _decode(hints[n], v[n], f"{path}.{n}") for n in names})
    if tp is float and isinstance(v, int | float) and not isinstance(v, bool):
        return float(v)
    if tp is type(None) and v is None:
        return None
    if isinstance(tp, type) and isinstance(v, tp) and not (tp is int and isinstance(v, bool)):
        return v
    raise ReportError(f"{path}: expected {getattr(tp, '__name__', tp)}, got {v!r}")


def _decode_union(args: tuple[Any, ...], v: Any, path: str) -> Any:
    if isinstance(v, dict) and "skipped" in v and Skipped in args:
        return Skipped(str(v["skipped"]), str(v.get("call", "")))
    if isinstance(v, dict) and "failed" in v and Failed in args:
        return Failed(str(v["failed"]), int(v.get("code", 0)), str(v.get("call", "")))
    errors = []
    for a in args:
        if a in (Skipped, Failed):
            continue
        try:
            return _decode(a, v, path)
        except ReportError as e:
            errors.append(str(e))
    raise ReportError(errors[0] if len(errors) == 1 else f"{path}: {v!r} fits none of {args}")
