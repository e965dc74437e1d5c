"""Round-tripping frozen dataclasses through JSON.

Every box in the data flow (Profile, Plan, ...) is a frozen dataclass whose
fields are plain values, enums, tuples or other such dataclasses. These two
helpers turn them into JSON-ready dicts and back, so each dataclass only has to
name its own type.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import typing
from typing import Any, TypeVar

T = TypeVar("T")

MAX_INT = 2**63 - 1
"""Largest integer a JSON file may hold: every count and byte size we store fits
in int64; anything larger (10**400) is a forged or broken file."""
_MAX_DIGITS = len(str(MAX_INT))


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows (NaN and Infinity are rejected)")


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_DIGITS or abs(int(text)) > MAX_INT:
        raise ValueError(f"integer {text[:20]}{'...' if len(text) > 20 else ''} is out of range (|n| <= 2**63-1)")
    return int(text)


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:20]} is out of range")
    return value


def loads_strict(text: str | bytes) -> Any:
    """json.loads for files a user hands us: UTF-8 only, no NaN/Infinity, no
    integer beyond int64, no float that overflows, no nesting deep enough to
    exhaust the stack. Any problem is a ValueError with one line."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"not UTF-8 text (byte {e.start})") from None
    try:
        return json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int,
                          parse_float=_parse_float)
    except json.JSONDecodeError as e:
        raise ValueError(f"not valid JSON ({e.msg} at line {e.lineno})") from None
    except RecursionError:
        raise ValueError("not valid JSON (nested too deeply)") from None


def to_dict(obj: Any) -> Any:
    """Dataclass/enum/tuple tree -> JSON-ready dicts, lists and scalars."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, enum.Enum):
        return obj.value
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def from_dict(cls: type[T], data: Any) -> T:
    """Inverse of `to_dict` for the dataclass `cls`; raises ValueError on bad shape."""
    if not isinstance(data, dict):
        raise ValueError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ValueError(f"{cls.__name__}: missing key {f.name!r}")
            continue
        kwargs[f.name] = _convert(hints[f.name], data[f.name], f"{cls.__name__}.{f.name}")
    return cls(**kwargs)


def _convert(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, where)
    if origin in (tuple, list):
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list")
        elem = args[0] if args else Any
        return tuple(_convert(elem, v, where) for v in value)
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}: expected an object")
        if len(args) == 2:
            return {str(k): _convert(args[1], v, f"{where}[{k!r}]") for k, v in value.items()}
        return dict(value)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return from_dict(tp, value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        try:
            return tp(value)
        except ValueError:
            raise ValueError(f"{where}: {value!r} is not one of {[m.value for m in tp]}") from None
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        if (isinstance(value, int) and abs(value) > MAX_INT) or not math.isfinite(float(value)):
            raise ValueError(f"{where}: expected a finite number, got {value!r}")
        return float(value)
    if tp is int and isinstance(value, int) and not isinstance(value, bool):
        if abs(value) > MAX_INT:
            raise ValueError(f"{where}: integer out of range")
        return value
    if tp in (str, bool) and isinstance(value, tp):
        return value
    if tp in (int, float, str, bool):
        raise ValueError(f"{where}: expected {tp.__name__}, got {value!r}")
    return value
