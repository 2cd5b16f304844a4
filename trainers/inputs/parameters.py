"""Type checks of the Python API's parameters: a value of the wrong type is one `TypeError` naming the function, the
parameter and what to pass, before it would be read as something else (the string "no" as true) or fail deep in a
library. The command line's parser converts its text to these types first.
"""

from __future__ import annotations

import functools
import numbers
import os
import types
import typing
from collections.abc import Mapping
from typing import Any


def check_bool(where: str, name: str, value: Any) -> None:
    """Refuse a `value` of parameter `name` that is not True or False ("no" and 0 included: either would be read
    as a truth value)."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {name}={value!r} is not a bool; give True or False")


def check_path(where: str, name: str, value: Any, fix: str = "give a str or os.PathLike") -> None:
    """Refuse a `value` of parameter `name` that is neither a str nor an `os.PathLike`; `fix` says what to pass."""
    if not isinstance(value, str | os.PathLike):
        raise TypeError(f"{where}: {name}={value!r} ({type(value).__name__}) is not a path; {fix}")


def is_number(value: Any, *, integer: bool = False, optional: bool = False) -> bool:
    """Whether `value` is a number (a whole one if `integer`; None too if `optional`); a bool is none."""
    if value is None:
        return optional
    return not isinstance(value, bool) and isinstance(value, numbers.Integral if integer else numbers.Real)


def check_number(where: str, name: str, value: Any, *, integer: bool = False, optional: bool = False) -> None:
    """Refuse a `value` of parameter `name` that is not a number (a whole one if `integer`; None if `optional`).
    A bool is no number here."""
    if is_number(value, integer=integer, optional=optional):
        return
    kind = "a whole number; give an int" if integer else "a number; give a float"
    raise TypeError(f"{where}: {name}={value!r} is not {kind}{' or None' if optional else ''}")


@functools.cache
def bool_fields(options_class: type) -> dict[str, bool]:
    """The fields of dataclass `options_class` typed `bool` or `bool | None`: name -> None allowed."""
    fields = {}
    for name, hint in typing.get_type_hints(options_class).items():
        kinds = set(typing.get_args(hint)) if isinstance(hint, types.UnionType) or typing.get_origin(
            hint) is typing.Union else {hint}
        if bool in kinds and kinds <= {bool, type(None)}:
            fields[name] = type(None) in kinds
    return fields


def check_bool_options(where: str, options_class: type, values: Mapping[str, Any]) -> None:
    """Refuse a value in `values` (field name -> value: the keyword arguments of dataclass `options_class`, or an
    instance's `vars`) of a bool field that is not True or False (or None where the field allows it)."""
    for name, optional in bool_fields(options_class).items():
        if name in values and not (values[name] is None and optional):
            check_bool(where, name, values[name])


__all__ = ["bool_fields", "check_bool", "check_bool_options", "check_number", "check_path", "is_number"]
