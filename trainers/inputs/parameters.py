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
from collections.abc import Callable, Mapping
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


def list_parameter(where: str, name: str, value: Any, *, paths: bool = False) -> list:
    """The items of list parameter `name` of `where`: one str (or path, if `paths`) is one item, never a list of
    its characters; None is none. Anything else, or an item of another type, is a `TypeError` naming `name`."""
    kind, kinds = ("str or os.PathLike", str | os.PathLike) if paths else ("str", str)
    items = [] if value is None else [value] if isinstance(value, str | os.PathLike) else value
    if not isinstance(items, list | tuple):
        raise TypeError(f"{where}: {name}={value!r} ({type(value).__name__}) is neither a {kind} nor a list of "
                        f"them; give one {kind} or a list")
    for i, item in enumerate(items):
        if not isinstance(item, kinds):
            raise TypeError(f"{where}: {name}[{i}]={item!r} ({type(item).__name__}) is not a {kind}")
    return list(items)


def type_kinds(hint: Any) -> set:
    """The types a type hint admits: each member of a union (`X | None`, `Union[...]`), else the hint itself."""
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    return set(typing.get_args(hint)) if union else {hint}


@functools.cache
def bool_fields(options_class: type) -> dict[str, bool]:
    """The fields of dataclass `options_class` (or the parameters of a function) typed `bool` or `bool | None`:
    name -> None allowed."""
    fields = {}
    for name, hint in typing.get_type_hints(options_class).items():
        kinds = type_kinds(hint)
        if bool in kinds and kinds <= {bool, type(None)}:
            fields[name] = type(None) in kinds
    return fields


def check_bool_options(where: str, options_class: type | Callable, values: Mapping[str, Any]) -> None:
    """Refuse a value in `values` (field name -> value: the keyword arguments of dataclass or function
    `options_class`, or an instance's `vars`) of a bool field that is not True or False (or None where the field
    allows it)."""
    for name, optional in bool_fields(options_class).items():
        if name in values and not (values[name] is None and optional):
            check_bool(where, name, values[name])


# how a corpus of several files is given: --corpus and read_corpus take one path
SEVERAL_FILES = "several files: put them in one folder, which is read whole"


__all__ = ["SEVERAL_FILES", "bool_fields", "check_bool", "check_bool_options", "check_number", "check_path",
           "is_number", "list_parameter", "type_kinds"]
