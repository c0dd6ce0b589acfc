"""A value read from YAML or `--set`, checked against its field's type: one line naming the key and the source.

Numbers written as strings like '1e-3' load as floats (PyYAML reads 1e-3, without a dot, as a string); an integral
float loads as an int; a list loads as a tuple of integers.
"""

from __future__ import annotations

import difflib
import math
import typing
from typing import Any

from dqn_cartpole.errors import ConfigError


def coerce(value: Any, hint: Any, key: str, source: str) -> Any:
    """`value` as the field's type `hint`, or a ConfigError `SOURCE: KEY: expected ..., got ...`."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union and type(None) in args:
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
    if hint in (tuple, tuple[str, ...]):
        return _items(value, int if hint is tuple else str, key, source)
    problem = f"{source}: {key}: expected {type_name(hint)}, got {describe(value)}"
    coerced = _SCALARS[hint](value) if hint in _SCALARS else _unsupported(hint)
    if coerced is _BAD:
        raise ConfigError(problem)
    return coerced


_BAD = object()  # a value the type does not take


def _bool(value: Any) -> Any:
    return value if isinstance(value, bool) else _BAD


def _int(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        return int(value)
    return _BAD


def _float(value: Any) -> Any:
    if isinstance(value, bool):
        return _BAD
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:  # PyYAML reads 1e-3 (no dot) as a string: coerce on purpose.
            return float(value)
        except ValueError:
            pass
    return _BAD


def _str(value: Any) -> Any:
    return value if isinstance(value, str) else _BAD


_SCALARS = {bool: _bool, int: _int, float: _float, str: _str}


def _unsupported(hint: Any) -> Any:
    raise AssertionError(f"unsupported config type {hint}")


def _items(value: Any, kind: type, key: str, source: str) -> tuple:
    """A list of `kind` (int or str; true and false are neither) as a tuple."""
    what = "integers" if kind is int else "strings"
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{source}: {key}: expected a list of {what}, got {describe(value)}")
    for number, item in enumerate(value, 1):
        if not isinstance(item, kind) or isinstance(item, bool):
            raise ConfigError(f"{source}: {key}: expected a list of {what}, but item {number} is {describe(item)}")
    return tuple(value)


def type_name(hint: Any) -> str:
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def describe(value: Any) -> str:
    return f"{type(value).__name__} {value!r}" if not isinstance(value, (dict, list)) else type(value).__name__


def suggest(name: str, options: typing.Iterable[str]) -> str:
    """` (did you mean 'X'?)` for the option nearest a misspelled `name`, or ''."""
    match = difflib.get_close_matches(name, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{match[0]}'?)" if match else ""


def plain(value: Any) -> Any:
    """A value as YAML-able data: a tuple becomes a list."""
    return list(value) if isinstance(value, tuple) else value
